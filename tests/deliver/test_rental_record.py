"""rental.json validated like every record, and the rental clock's hours held to the window (issue 33 items 6
and 16): a clock that went back never shows more hours left than the window; a command the window ended in
counts only up to the end and is named; ``"clock": null`` or a forged bundle path is one line naming the
key; a delivery is claimed verified only while its bundle still checks; a killed command's open ledger entry
stops counting. Registry-level, with an injected clock: no model is loaded."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tuneproof import clock
from tuneproof.cli import main
from tuneproof.deliver import rental as rent
from tuneproof.deliver.bundle import BUNDLE_KIND, MANIFEST, file_hashes, write_manifest_sha
from tuneproof.errors import TuneproofError
from tuneproof.io import sha256_file, write_json
from tuneproof.registry import Registry

T0 = 1_900_000_000.0  # 2030-03-17 17:46 UTC
WORK = {"steps": 12, "checkpoint_every": 4, "n_eval": 12, "n_test": 6}


def cli(*args) -> int:
    with pytest.raises(SystemExit) as e:
        main([str(a) for a in args])
    return e.value.code


@pytest.fixture
def window(tmp_path):
    reg = Registry(tmp_path)
    rental = rent.start(tmp_path, reg, days=1, ends=None, now=T0, work=WORK)
    return tmp_path, reg, rental


@pytest.mark.fault("machine: the clock goes back during a rental")
def test_a_clock_that_went_back_never_shows_more_hours_left_than_the_window(window):
    d, reg, rental = window
    assert rent.observe(rental, T0 - 3 * 3600, "rental status")  # 3 h back right after the start
    st = rent.status(rental, reg, d, T0 - 3 * 3600, WORK)
    assert st["left_h"] == pytest.approx(24.0)  # it read 27.0 h left in a 24 h window
    assert st["flags"][0].startswith("the clock went back 3.00 h in this window: hours left count from")
    # 10 h into the window the clock steps back 3 h again: 14 h are left, not 17
    rental2 = rent.start(d / "other", reg, days=1, ends=None, now=T0, work=WORK)
    rent.observe(rental2, T0 + 10 * 3600, "train")
    rent.observe(rental2, T0 + 7 * 3600, "rental status")
    assert rent.status(rental2, reg, d, T0 + 7 * 3600, WORK)["left_h"] == pytest.approx(14.0)


def test_a_reading_before_the_window_is_clamped_to_the_window_and_flagged(window):
    d, reg, rental = window
    rental["clock"]["went_back"] = []  # no step seen (the study was copied to a machine behind it)
    st = rent.status(rental, reg, d, T0 - 5 * 3600, WORK)
    assert st["left_h"] == pytest.approx(24.0)
    assert any("before the window's start" in f and "clamped to the window (24.0 h)" in f for f in st["flags"])


def test_a_window_that_ends_during_an_eval_counts_the_eval_up_to_the_end_and_names_it(tmp_path):
    reg = Registry(tmp_path)
    rental = rent.start(tmp_path, reg, days=1 / 24, ends=None, now=T0, work=WORK)  # a 1 h window
    rental["commands"].append(
        {
            "command": "eval",
            "phase": "evaluation",
            "start": T0 + 0.5 * 3600,
            "end": T0 + 48.01 * 3600,
            "estimate_s": 600.0,
            "basis": "",
            "status": "completed",
            "runs": ["r0007"],
        }
    )
    st = rent.status(rental, reg, tmp_path, T0 + 49 * 3600, WORK)
    evaluation = next(p for p in st["phases"] if p["phase"] == "evaluation")
    assert evaluation["used_h"] == pytest.approx(0.5)  # it recorded 47.51 h in a 1 h window
    assert st["commands"][0]["used_h"] == pytest.approx(0.5)
    assert st["commands"][0]["past_end_h"] == pytest.approx(47.01)
    assert "eval (r0007) ran 47.01 h past the window's end 2030-03-17 18:46 UTC" in st["flags"][0]
    assert st["ended"] and st["left_h"] < 0
    assert sum(p["used_h"] for p in st["phases"]) <= 1.0


def test_a_clock_step_back_during_a_command_counts_zero_hours_not_negative(window):
    d, reg, rental = window
    rental["commands"].append(
        {"command": "train", "phase": "experiment", "start": T0 + 3600, "end": T0 - 3600, "estimate_s": 1.0}
    )
    st = rent.status(rental, reg, d, T0 + 2 * 3600, WORK)
    assert st["commands"][0]["used_h"] == 0.0 and st["phases"][1]["used_h"] == 0.0


def _write(d, rental):
    write_json(d / rent.RENTAL_FILE, rental)


@pytest.mark.fault("input: a damaged or forged rental.json")
@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (
            lambda r: r.update(clock=None),
            "rental.json: clock: Input should be a valid dictionary (got None)",
        ),
        (
            lambda r: r.update(delivered={"train": "r0003", "bundle": "../../../../etc", "verified": True}),
            "rental.json: delivered.bundle '../../../../etc' leads out of the study folder ('..')",
        ),
        (
            lambda r: r.update(delivered={"train": "r0003", "bundle": "/etc", "verified": True}),
            "rental.json: delivered.bundle '/etc' is not a path relative to the study folder",
        ),
        (
            lambda r: r["commands"].append({"command": "eval", "phase": "evaluation", "start": "soon"}),
            "rental.json: commands.0.start: Input should be a valid number",
        ),
        (lambda r: r.update(ends=r["start"] - 1), "is not after start"),
        (lambda r: r.update(rental_schema="one"), "rental.json: rental_schema: Input should be a valid integer"),
    ],
)
def test_a_damaged_or_forged_rental_record_is_one_line_naming_the_key(window, edit, said):
    d, reg, rental = window
    edit(rental)
    _write(d, rental)
    with pytest.raises(TuneproofError) as err:
        rent.load(d)
    assert said in err.value.message and len(err.value.message.splitlines()) == 1
    assert "restore rental.json from a copy of the study" in err.value.hint


def test_rental_status_with_a_null_clock_exits_2_without_a_traceback(cls_study, tmp_path, capsys):
    d = tmp_path / "study"
    shutil.copytree(cls_study["dir"], d)
    with clock.use(lambda: T0):
        assert cli("rental", "start", "--days", "1", "--study", d) == 0
    raw = json.loads((d / rent.RENTAL_FILE).read_text())
    raw["clock"] = None
    (d / rent.RENTAL_FILE).write_text(json.dumps(raw))
    capsys.readouterr()
    assert cli("rental", "status", "--study", d) == 2
    out, err = capsys.readouterr()
    assert "clock: Input should be a valid dictionary (got None)" in " ".join(out.split())
    assert "Traceback" not in out + err
    # a forged deliverable outside the study is never shown as delivered and verified (status nor dossier)
    raw["clock"] = {"last_seen": T0, "went_back": []}
    raw["delivered"] = {"train": cls_study["ids"]["train"], "bundle": "../../../../etc", "verified": True}
    (d / rent.RENTAL_FILE).write_text(json.dumps(raw))
    assert cli("rental", "status", "--study", d) == 2
    assert "delivered.bundle '../../../../etc' leads out of the study folder" in " ".join(
        capsys.readouterr().out.split()
    )
    assert cli("report", "--study", d) in (0, 3)
    md = (d / "dossier.md").read_text()
    first = md.split("\n## ", 2)[1]
    assert "rental: NOT READ (" in first and "delivered.bundle '../../../../etc' leads out" in first
    assert "verified in a fresh process" not in md.split("## Rental", 1)[1].split("\n## ", 1)[0]


def _bundle(d, name="exports/r0003"):
    b = d / name
    (b / "adapter").mkdir(parents=True)
    (b / "adapter" / "adapter_model.safetensors").write_bytes(b"weights")
    write_json(b / MANIFEST, {"kind": BUNDLE_KIND, "schema_version": 1, "files": file_hashes(b)})
    write_manifest_sha(b)
    return b


def test_a_delivery_is_claimed_verified_only_while_its_bundle_still_checks(window):
    d, reg, rental = window
    b = _bundle(d)
    rental["delivered"] = {
        "train": "r0003",
        "bundle": "exports/r0003",
        "verified": True,
        "manifest_sha256": sha256_file(b / MANIFEST),
    }
    st = rent.status(rental, reg, d, T0 + 3600, WORK)
    assert st["delivered"]["verified"] is True and st["next"].startswith("delivered: exports/r0003 verified")
    (b / "adapter" / "tokenizer.json").write_text("{}")  # a file added after the delivery
    st = rent.status(rental, reg, d, T0 + 3600, WORK)
    assert st["delivered"] == {
        "train": "r0003",
        "bundle": "exports/r0003",
        "verified": False,
        "problem": "exports/r0003 changed since it was verified: "
        "extra file not in the manifest: adapter/tokenizer.json",
    }
    assert st["next"].startswith("the delivery is not verified (exports/r0003 changed since it was verified")
    shutil.rmtree(b)
    assert "no such bundle folder" in rent.delivery(d, rental["delivered"])["problem"]
    assert rent.verified_export(reg, d, rental["delivered"]) is None


@pytest.mark.fault("leftovers: a killed command open in the rental ledger")
def test_a_killed_commands_open_entry_stops_counting_at_the_last_time_it_was_seen(window):
    d, reg, rental = window
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid that no longer runs (kill -9 of rental deliver)
    with clock.use(lambda: T0 + 1800):
        with reg.run("export") as r:
            pass
    rental["commands"].append(
        {
            "command": "deliver",
            "phase": "export",
            "start": T0 + 600,
            "end": None,
            "estimate_s": 60.0,
            "basis": "",
            "pid": gone.pid,
            "host": rent.socket.gethostname(),
            "proc_start": None,
            "first_seq": 1,
        }
    )
    said = rent.close_orphans(rental, reg, T0 + 20 * 3600)
    entry = rental["commands"][0]
    assert entry["end"] == T0 + 1800 and entry["runs"] == [r.id]  # its export run's last beat, not 20 h later
    assert entry["status"].startswith(f"killed: process {gone.pid} was gone")
    assert said == [
        f"deliver (pid {gone.pid}) ended without recording its end: counted up to 2030-03-17 18:16 UTC, "
        "the last time it was seen"
    ]
    st = rent.status(rental, reg, d, T0 + 20 * 3600, WORK)
    assert next(p for p in st["phases"] if p["phase"] == "export")["used_h"] == pytest.approx(1200 / 3600)
    # a live process keeps its entry open
    rental["commands"][0].update(end=None, pid=os.getpid())
    assert rent.close_orphans(rental, reg, T0 + 20 * 3600) == [] and rental["commands"][0]["end"] is None
