"""The registry survives its own damage (docs/CASES.md, faults of the machine): each run folder holds its own record; a
missing index is rebuilt automatically with a note, a damaged one is reported in one line and
rebuilt with `tuneproof registry rebuild`; a new run never reuses a folder; heartbeats make a run
of a gone host stale; `tuneproof runs mark-interrupted` marks one explicitly."""

from __future__ import annotations

import json
import os
import socket
import time

import pytest

import tuneproof.registry as R
import tuneproof.registry.signals as registry_signals
from tuneproof.cli import main
from tuneproof.errors import TuneproofError
from tuneproof.registry import Registry

pytestmark = pytest.mark.filterwarnings("ignore")


def cli(args, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(args)
    out = capsys.readouterr()
    return exit_.value.code, out.out + out.err


def _three_runs(study):
    reg = Registry(study)
    with reg.run("baseline") as a:
        a.set(config_hash="c" * 64, data_fingerprint="d" * 64, eval_fingerprint="e" * 64)
        a.update_summary(metrics={"accuracy": 0.5})
        a.metric(step=1, loss=2.0)
    with pytest.raises(ValueError), reg.run("train", parent=a.id, name="lora") as b:
        b.metric(step=1, loss=1.5)
        raise ValueError("boom")
    with reg.run("test") as c:
        reg.log_test_access(c.id, "base", {"metrics": {"accuracy": 0.4}})
    reg.close()
    return a.id, b.id, c.id


def _drop_index(study):
    for ext in ("", "-wal", "-shm"):
        p = study / f"tuneproof.sqlite{ext}"
        if p.exists():
            p.unlink()


@pytest.mark.fault("registry: run folder record")
def test_each_run_folder_holds_its_record_in_sync_with_the_index(tmp_path):
    a, b, _ = _three_runs(tmp_path)
    reg = Registry(tmp_path)
    for rid in (a, b):
        rec = json.loads((tmp_path / "runs" / rid / "run.json").read_text())
        row = reg.row(rid)
        assert rec["schema_version"] == R.RECORD_SCHEMA == 2  # schema 2: carries record_sha256
        for key in (
            "id",
            "seq",
            "kind",
            "status",
            "reason",
            "parent",
            "created",
            "ended",
            "host",
            "pid",
            "config_hash",
            "data_fingerprint",
            "eval_fingerprint",
            "summary",
            "heartbeat",
        ):
            assert rec[key] == row[key], key
    rec = json.loads((tmp_path / "runs" / a / "run.json").read_text())
    assert (rec["id"], rec["kind"], rec["status"], rec["config_hash"], rec["summary"]) == (
        a,
        "baseline",
        "completed",
        "c" * 64,
        {"metrics": {"accuracy": 0.5}},
    )
    rec = json.loads((tmp_path / "runs" / b / "run.json").read_text())
    assert (rec["id"], rec["status"], rec["reason"], rec["parent"]) == (
        "r0002-lora",
        "failed",
        "ValueError: boom",
        "r0001",
    )
    assert not list((tmp_path / "runs").rglob(".*.tmp"))


@pytest.mark.fault("registry: deleted index")
def test_a_deleted_index_is_rebuilt_from_the_run_folders_with_a_note(tmp_path, capsys):
    a, b, c = _three_runs(tmp_path)
    metrics_before = (tmp_path / "runs" / a / "metrics.jsonl").read_text()
    _drop_index(tmp_path)
    code, out = cli(["runs", "--study", str(tmp_path)], capsys)
    assert code == 0
    assert f"note: {tmp_path / 'tuneproof.sqlite'} was missing: rebuilt from 3 run folder(s)" in out
    reg = Registry(tmp_path)
    assert [(r.id, r.status, r.reason) for r in reg.list()] == [
        (a, "completed", None),
        (b, "failed", "ValueError: boom"),
        (c, "completed", None),
    ]
    assert reg.get(a).summary == {"metrics": {"accuracy": 0.5}} and reg.get(a).data_fingerprint == "d" * 64
    assert [t["candidate"] for t in reg.test_accesses()] == ["base"]  # the sealed split's read log survives
    with reg.run("eval") as new:
        new.metric(step=1, loss=9.0)
    assert new.id == "r0004"  # never r0001 again
    assert (tmp_path / "runs" / a / "metrics.jsonl").read_text() == metrics_before


@pytest.mark.fault("registry: damaged index")
@pytest.mark.parametrize("damage", ["garbage", "malformed page"])
def test_a_damaged_index_is_one_line_then_rebuilt_with_one_command(tmp_path, capsys, damage):
    from tuneproof.recipes.init import template_text

    a, b, c = _three_runs(tmp_path)
    (tmp_path / "tuneproof.yaml").write_text(template_text("extraction"))
    db = tmp_path / "tuneproof.sqlite"
    if damage == "garbage":
        db.write_bytes(b"this is not a database at all" * 200)
    else:
        raw = bytearray(db.read_bytes())
        assert len(raw) >= 8192
        raw[4096:8192] = b"\xff" * 4096  # the second page (the runs table) is trash; the header is fine
        db.write_bytes(bytes(raw))
    for args in (["runs"], ["show", "r0001"], ["invalidate", "r0001", "--why", "x"]):
        code, out = cli([*args, "--study", str(tmp_path)], capsys)
        assert code == 2, out
        assert f"{db}: the run registry is damaged" in out and "tuneproof registry rebuild" in out
        assert "Traceback" not in out and "DatabaseError" not in out
        assert len(out.strip().splitlines()) == 2
    code, out = cli(["registry", "rebuild", "--study", str(tmp_path)], capsys)
    assert code == 0 and "rebuilt" in out and "from 3 run folder(s), 1 test-split read(s)" in out
    kept = list(tmp_path.glob("tuneproof.sqlite.damaged-*"))
    assert len(kept) == 1 and kept[0].name in out.replace("\n", "")
    reg = Registry(tmp_path)
    assert [(r.id, r.kind, r.status) for r in reg.list()] == [
        (a, "baseline", "completed"),
        (b, "train", "failed"),
        (c, "test", "completed"),
    ]


@pytest.mark.fault("registry: folder reuse")
def test_a_new_run_never_reuses_an_existing_folder(tmp_path, capsys):
    reg = Registry(tmp_path)
    with reg.run("baseline"):
        pass
    (tmp_path / "runs" / "r0005-orphan").mkdir()  # a folder the index does not know (its record lost)
    (tmp_path / "runs" / "r0005-orphan" / "summary.json").write_text(json.dumps({"kind": "train", "steps": 3}))
    (tmp_path / "runs" / "r0005-orphan" / "metrics.jsonl").write_text('{"step": 1}\n')
    with reg.run("train") as run:
        run.metric(step=1, loss=1.0)
    assert run.id == "r0006"
    assert (tmp_path / "runs" / "r0005-orphan" / "metrics.jsonl").read_text() == '{"step": 1}\n'
    _drop_index(tmp_path)
    reg = Registry(tmp_path)
    capsys.readouterr()
    rec = reg.get("r0005")
    assert (rec.id, rec.kind, rec.status) == ("r0005-orphan", "train", "invalid")
    assert rec.reason == "record lost: rebuilt from the folder without a readable run.json"
    assert reg.create("eval").id == "r0007"


@pytest.mark.fault("registry: heartbeat")
def test_the_live_process_writes_its_heartbeat(tmp_path, monkeypatch):
    monkeypatch.setattr(registry_signals, "HEARTBEAT_S", 0.05)  # read where the heartbeat thread starts
    reg = Registry(tmp_path)
    with reg.run("train") as run:
        first = reg.row(run.id)["heartbeat"]
        deadline = time.monotonic() + 10
        while reg.row(run.id)["heartbeat"] == first and time.monotonic() < deadline:
            time.sleep(0.02)
        beat = reg.row(run.id)["heartbeat"]
        assert beat > first
        assert json.loads((tmp_path / "runs" / run.id / "run.json").read_text())["heartbeat"] >= beat - 1.0
    assert registry_signals.HEARTBEAT_S == 0.05 and R.STALE_AFTER_S == 300.0


@pytest.mark.fault("registry: heartbeat")
def test_a_run_of_another_host_is_stale_once_its_heartbeat_is_old(tmp_path):
    reg = Registry(tmp_path)
    run = reg.create("train")
    now = time.time()
    reg._update(run.id, host="old-container-7f3a", pid=4242, heartbeat=now - 120)  # 2 min: still alive somewhere
    assert Registry(tmp_path).get(run.id).status == "running"
    reg._update(run.id, heartbeat=now - 600)  # 10 min, older than STALE_AFTER_S
    rec = Registry(tmp_path).get(run.id)
    assert rec.status == "interrupted"
    assert rec.reason == "no heartbeat for 10 min (host old-container-7f3a, pid 4242; stale after 5 min): found stale"
    assert json.loads((tmp_path / "runs" / run.id / "run.json").read_text())["status"] == "interrupted"


@pytest.mark.fault("registry: mark interrupted")
def test_mark_interrupted_by_hand(tmp_path, capsys):
    reg = Registry(tmp_path)
    gone = reg.create("train")
    reg._update(gone.id, host="old-container-7f3a", pid=4242, heartbeat=time.time() - 30)
    live = reg.create("eval")  # this very process, on this host
    with reg.run("baseline") as done:
        pass
    code, out = cli(
        ["runs", "mark-interrupted", gone.id, "--why", "container restarted", "--study", str(tmp_path)], capsys
    )
    assert code == 0 and f"{gone.id}: interrupted" in out and f"next: tuneproof resume {gone.id}" in out
    rec = Registry(tmp_path).get(gone.id)
    assert rec.status == "interrupted"
    assert rec.reason.startswith("marked interrupted: container restarted (last heartbeat ")
    assert rec.reason.endswith(" UTC, host old-container-7f3a, pid 4242)")
    code, out = cli(["runs", "mark-interrupted", live.id, "--why", "x", "--study", str(tmp_path)], capsys)
    assert (
        code == 2
        and f"runs in the live process {os.getpid()} on this host" in out
        and f"kill -TERM {os.getpid()}" in out
    )
    assert Registry(tmp_path).get(live.id).status == "running"
    code, out = cli(["runs", "mark-interrupted", done.id, "--why", "x", "--study", str(tmp_path)], capsys)
    assert code == 2 and f"run {done.id} is completed, not running" in out
    code, out = cli(["runs", "mark-interrupted", gone.id, "--study", str(tmp_path)], capsys)
    assert code == 2 and "--why" in out


@pytest.mark.fault("registry: heartbeat")
def test_resume_of_a_run_alive_elsewhere_names_where_and_the_way_out(tmp_path):
    from tuneproof.recipes.resume import _refuse_status

    reg = Registry(tmp_path)
    run = reg.create("train")
    reg._update(run.id, host="gpu-3", pid=99, heartbeat=time.time() - 20)
    with pytest.raises(TuneproofError) as err:
        _refuse_status(reg.get(run.id), reg)
    assert "is still running (pid 99 on host gpu-3, last heartbeat 20 s ago)" in str(err.value)
    assert f"tuneproof runs mark-interrupted {run.id} --why" in str(err.value)
    assert socket.gethostname() != "gpu-3"
