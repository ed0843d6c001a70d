"""The rental clock (tuneproof.deliver.rental, tuneproof.recipes.rental): a window recorded with its
plan and rate sources; a variant that would cross the reserve refused (exit 3) and then overridden
with a recorded reason; a train run stopped at a checkpoint by the reserve and resumed; a deliver
run (export, verify in a fresh process, dossier); a study moved to another machine and a clock that
went back. Time comes from an injected clock (tuneproof.clock.use), never from sleeping."""

from __future__ import annotations

import json
import shutil

import pytest

from tuneproof import clock
from tuneproof.cli import main
from tuneproof.context import StudyContext
from tuneproof.deliver import rental as rent
from tuneproof.errors import TuneproofError
from tuneproof.recipes.rental import study_work
from tuneproof.registry import Registry, Run
from tuneproof.ui import console

T0 = 1_900_000_000.0  # 2030-03-17 17:46 UTC
SKIPS = ["--skip-preflight", "no preflight in this test", "--skip-data-check", "no data check in this test"]


def cli(*args) -> int:
    with pytest.raises(SystemExit) as e:
        main([str(a) for a in args])
    return e.value.code


@pytest.fixture
def study(cls_study, tmp_path):
    d = tmp_path / "study"
    shutil.copytree(cls_study["dir"], d)
    return d, cls_study["ids"]


def _rental(d):
    return json.loads((d / rent.RENTAL_FILE).read_text())


def _numbers(d, command):
    """The rates, reserve and estimate the gate computes for ``command`` at this point."""
    ctx = StudyContext.open(d)
    work = study_work(ctx)
    r = rent.rates(ctx.registry)
    reserve_s, _ = rent.reserve(r, work, command)
    est_s, _ = rent.estimate(r, work, command)
    ctx.registry.close()
    return reserve_s, est_s, r


def test_start_records_the_window_the_plan_and_where_each_rate_came_from(study, capsys, monkeypatch):
    d, ids = study
    t = [T0]
    with clock.use(lambda: t[0]):
        assert cli("rental", "start", "--days", "3", "--study", d) == 0
        again = cli("rental", "start", "--days", "3", "--study", d)
        assert cli("rental", "start", "--days", "3", "--ends", "yesterday", "--study", tmp := d.parent / "x") == 2
    assert again == 2 and not tmp.exists()
    rental = _rental(d)
    assert rental["schema_version"] == 1 and rental["rental_schema"] == 1
    assert (rental["start"], rental["ends"]) == (T0, T0 + 3 * 86400)
    assert rental["work"] == {"steps": 12, "checkpoint_every": 12, "n_eval": 12, "n_test": 6}
    assert rental["rates"]["step_source"] == "median of 1 completed train run(s) (the training as it ran)"
    assert rental["rates"]["rate_kinds"] == {"s_per_step": "runs", "eval_s_per_example": "runs", "reload_s": "runs"}
    assert [p["phase"] for p in rental["plan"]["phases"]] == list(rent.PHASES)
    assert rental["machines"][0]["first_seen"] == T0 and rental["commands"] == []
    out = capsys.readouterr().out
    assert "rental window: 2030-03-17 17:46 UTC to 2030-03-20 17:46 UTC (3 days)" in out
    assert "a rental window is already recorded (ends 2030-03-20 17:46 UTC)" in out

    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setattr(console, "_width", 80)
    t[0] = T0 + 5 * 3600
    with clock.use(lambda: t[0]):
        assert cli("rental", "status", "--study", d) == 0
        screen = capsys.readouterr().out
        assert cli("rental", "status", "--json", "--study", d) == 0
    st = json.loads(capsys.readouterr().out)
    assert max(len(line) for line in screen.splitlines()) <= 80
    assert "67.0 h left" in screen and "next: tuneproof preflight" in screen
    assert st["left_h"] == pytest.approx(67.0) and not st["ended"] and not st["reserve_reached"]
    assert [p["phase"] for p in st["phases"]] == list(rent.PHASES)
    assert all(p["used_h"] == 0.0 for p in st["phases"])
    assert st["reserve_parts"][0].startswith("candidate evaluation ")


def test_a_variant_that_would_cross_the_reserve_is_refused_and_an_override_is_recorded(study, capsys):
    d, ids = study
    t = [T0]
    with clock.use(lambda: t[0]):
        assert cli("rental", "start", "--days", "3", "--study", d) == 0
        reserve_s, est_s, r = _numbers(d, "train")
        t[0] = T0 + 3 * 86400 - reserve_s - est_s / 2  # half the variant fits before the reserve
        variant = ("train", "--from", ids["train"], "--set", "training.learning_rate=0.01", *SKIPS, "--study", d)
        capsys.readouterr()
        assert cli(*variant) == 3
        out = capsys.readouterr().out
        assert f"rental: train needs ~{est_s / 3600:.2f} h (" in out
        assert f"but {est_s / 2 / 3600:.2f} h remain before the reserve of {reserve_s / 3600:.2f} h" in out
        assert "the window ends 2030-03-20 17:46 UTC" in out and "--use-reserve REASON" in out
        assert [x.kind for x in Registry(d).list()].count("train") == 1  # nothing started
        assert cli(*variant, "--use-reserve", "the last variant before delivery") == 0
    runs = Registry(d).list(kind="train")
    assert len(runs) == 2 and runs[-1].status == "completed"
    assert runs[-1].summary["rental_override"] == "the last variant before delivery"
    rental = _rental(d)
    (o,) = rental["overrides"]
    assert (o["command"], o["reason"], o["time"]) == ("train", "the last variant before delivery", t[0])
    (c,) = rental["commands"]
    assert (c["command"], c["phase"], c["status"], c["runs"]) == ("train", "experiment", "completed", [runs[-1].id])
    assert c["estimate_s"] == pytest.approx(est_s)
    capsys.readouterr()
    assert cli("runs", "--study", d) == 0
    assert "rental reserve used" in capsys.readouterr().out


def test_a_train_run_that_reaches_the_reserve_stops_at_a_checkpoint_and_resumes(study, capsys, monkeypatch):
    d, ids = study
    t = [T0]
    logged = Run.metric

    def one_hour_per_step(self, **row):  # each optimizer step takes an hour on this clock
        logged(self, **row)
        if "step" in row and "loss" in row:
            t[0] += 3600.0

    monkeypatch.setattr(Run, "metric", one_hour_per_step)
    with clock.use(lambda: t[0]):
        reserve_s, _, _ = _numbers(d, "train")
        ends = T0 + reserve_s + 2.5 * 3600  # the reserve starts 2.5 h (steps) from now
        ctx = StudyContext.open(d)
        rent.start(d, ctx.registry, days=1, ends=ends, now=T0, work=study_work(ctx))
        ctx.registry.close()
        code = cli("train", *SKIPS, "--study", d)
        err = capsys.readouterr().err
        rec = Registry(d).list(kind="train")[-1]
        assert code == 3 and rec.status == "interrupted"
        assert rec.reason == "stopped: rental reserve at step 3"
        assert f"run {rec.id} stopped: rental reserve at step 3; resume with: tuneproof resume {rec.id}" in err
        assert (d / "runs" / rec.id / "checkpoints" / "step-000003").is_dir()
        assert _rental(d)["commands"][-1]["status"] == "stopped: rental reserve"
        assert cli("rental", "status", "--json", "--study", d) == 0
        st = json.loads(capsys.readouterr().out)
        assert st["stopped"] == [{"run": rec.id, "reason": rec.reason, "status": "interrupted"}]
        # the 3rd step ends past the window (the reserve is shorter than a step): its hours count up to the end
        assert st["reserve_reached"] and st["phases"][1]["used_h"] == pytest.approx((ends - T0) / 3600)
        assert st["commands"][-1]["past_end_h"] == pytest.approx((T0 + 3 * 3600 - ends) / 3600)
        assert cli("resume", rec.id, "--study", d) == 3  # past the reserve: refused
        assert "rental: resume needs" in capsys.readouterr().out
        assert cli("resume", rec.id, "--use-reserve", "finish it, export is quick", "--study", d) == 0
    done = Registry(d).get(rec.id)
    assert done.status == "completed" and done.summary["last_step"] == 12
    assert done.summary["resumes"][0]["from_step"] == 3
    assert done.summary["rental_override"] == "finish it, export is quick"
    assert [c["status"] for c in _rental(d)["commands"]] == ["stopped: rental reserve", "completed"]
    capsys.readouterr()
    with clock.use(lambda: t[0]):
        assert cli("rental", "status", "--json", "--study", d) == 0
    st = json.loads(capsys.readouterr().out)  # the stop stays in the history once the resume completed the run
    assert st["stopped"] == [{"run": rec.id, "reason": "stopped: rental reserve at step 3", "status": "completed"}]
    # the resume's 9 steps ran after the window ended: none counts in it, each is named and the run flagged
    assert st["phases"][3]["used_h"] == 0.0 and st["commands"][-1]["past_end_h"] == pytest.approx(9.0)
    assert f"resume ({rec.id}) ran 9.00 h past the window's end" in " ".join(st["flags"])
    assert done.summary["rental_window_ended"].startswith("the rental window ended 2030-03-17 ")


def test_deliver_verifies_in_a_fresh_process_and_writes_the_dossier(cls_bundle, tmp_path, capsys):
    """The study exported its run already (cls_bundle): deliver keeps that export, verifies the
    bundle in a fresh process and writes the dossier; the first screen says the window's outcome."""
    d = tmp_path / "study"
    shutil.copytree(cls_bundle["dir"], d)
    train = cls_bundle["ids"]["train"]
    t = [T0]
    with clock.use(lambda: t[0]):
        assert cli("rental", "start", "--days", "3", "--study", d) == 0
        t[0] = T0 + 3 * 86400 + 60  # the window has ended: the dossier says so on its first screen
        capsys.readouterr()
        assert cli("rental", "status", "--json", "--study", d) == 0
        st = json.loads(capsys.readouterr().out)
        assert st["ended"] and st["delivered"] is None
        assert cli("report", "--study", d) in (0, 3)  # 3: this tiny study's dossier is INCOMPLETE, still written
        first = (d / "dossier.md").read_text().split("\n## ", 2)[1]
        assert "rental: the window ended 2030-03-20 17:46 UTC WITHOUT A VERIFIED EXPORT" in first
        code = cli("rental", "deliver", "--run", train, "--study", d)
    out = " ".join(capsys.readouterr().out.split())
    delivered = _rental(d)["delivered"]
    assert code in (0, 3) and delivered["train"] == train and delivered["verified"] is True
    assert delivered["export"] == cls_bundle["export"] and delivered["bundle"] == f"exports/{train}"
    assert f"from export run {cls_bundle['export']} (kept)" in out and "s in a fresh process)" in out
    assert [x.kind for x in Registry(d).list()].count("export") == 1
    md = (d / "dossier.md").read_text()
    assert f"rental: delivered {train} (exports/{train}, verified in a fresh process)" in md
    assert "## Rental" in md and f"delivered: {train} as exports/{train}, verified in a fresh process" in md
    assert [c["command"] for c in _rental(d)["commands"]] == ["deliver"]


def test_a_moved_study_keeps_its_window_and_a_clock_that_went_back_is_named(study, tmp_path, capsys, monkeypatch):
    d, ids = study
    t = [T0]
    with clock.use(lambda: t[0]):
        assert cli("rental", "start", "--days", "7", "--study", d) == 0
        t[0] = T0 + 10 * 3600
        assert cli("rental", "status", "--study", d) == 0
        moved = tmp_path / "elsewhere" / "study"
        shutil.copytree(d, moved)
        monkeypatch.setattr(rent.socket, "gethostname", lambda: "second-rental")
        t[0] = T0 + 8 * 3600  # this machine's clock is 2 h behind
        capsys.readouterr()
        assert cli("rental", "status", "--study", moved) == 0
        captured = capsys.readouterr()
        assert cli("rental", "status", "--json", "--study", moved) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["ends"] == T0 + 7 * 86400 and st["start"] == T0
    assert [m["host"] for m in st["machines"]][1:] == ["second-rental"]
    (back,) = st["clock_went_back"]
    assert (back["from"], back["to"], back["where"]) == (T0 + 10 * 3600, T0 + 8 * 3600, "rental status")
    err = " ".join(captured.err.split())
    assert "the clock went back 2.00 h (2030-03-18 03:46 UTC was recorded, it reads 2030-03-18 01:46 UTC" in err
    assert "the study runs on second-rental" in err and "(ends 2030-03-24 17:46 UTC) and its history are kept" in err
    assert "clock went back 2.00 h at rental status" in captured.out


def test_no_window_no_hold_and_an_override_without_a_window_is_refused(study, capsys):
    d, ids = study
    assert cli("eval", ids["train"], "--use-reserve", "why not", "--study", d) == 2
    assert "holds no rental window, so no reserve to use" in capsys.readouterr().out
    assert cli("rental", "status", "--study", d) == 2
    assert "no rental window recorded" in capsys.readouterr().out
    assert not (d / rent.RENTAL_FILE).exists()
    (d / rent.RENTAL_FILE).write_text('{"schema_version": 1, "rental_schema": 1}')
    assert cli("eval", ids["train"], "--study", d) == 2  # a damaged window is named, nothing is run
    assert f"{d / rent.RENTAL_FILE}: key 'ends' missing: not a rental record" in capsys.readouterr().out
    (d / rent.RENTAL_FILE).write_text('{"schema_version": 1, "rental_schema": 9, "ends": 1}')
    assert cli("rental", "status", "--study", d) == 2
    assert "rental_schema 9 is newer than this tuneproof reads (1)" in capsys.readouterr().out
    assert [r.kind for r in Registry(d).list()].count("eval") == 1


def test_at_the_reserve_the_status_names_the_best_passed_candidate_and_its_commands(tmp_path):
    """Two candidates passed, one failed: the larger success delta among the passed is named."""
    reg = Registry(tmp_path)
    with clock.use(lambda: T0):
        with reg.run("train") as r:
            r.update_summary(train_seconds=36.0, steps=12)
        with reg.run("baseline") as r:
            r.update_summary(eval_seconds=6.0, n_eval=12)
        trains = []
        for _ in range(3):
            with reg.run("train") as t:
                t.update_summary(train_seconds=36.0, steps=12)
            with reg.run("eval", parent=t.id) as e:
                e.update_summary(eval_seconds=6.0, n_eval=12)
            trains.append((t.id, e.id))
        with reg.run("compare") as c:
            c.write_json(
                "compare.json",
                {
                    "candidates": {
                        e: {"overall": {"verdict": v}, "verdicts": [{"kind": "success", "delta": dl}]}
                        for (_, e), v, dl in zip(trains, ("pass", "pass", "fail"), (0.05, 0.12, 0.30))
                    }
                },
            )
        work = {"steps": 12, "checkpoint_every": 4, "n_eval": 12, "n_test": 6}
        rental = rent.start(tmp_path, reg, days=3, ends=None, now=T0, work=work)
    r = rent.rates(reg)
    assert (r["s_per_step"], r["eval_s_per_example"]) == (3.0, 0.5)
    reserve_s, parts = rent.reserve(r, work, "train")
    reload_s = r["reload_s"]
    expected = (12 * 0.5 + reload_s) + (6 * 0.5 + reload_s) + 2 * (8 * 0.5 + reload_s) + reload_s
    assert reserve_s == pytest.approx(expected)
    assert [p.split(" ")[0] for p in parts] == ["candidate", "test", "export", "fresh-process"]
    assert rent.estimate(r, work, "train", variants=3)[0] == pytest.approx(3 * (12 * 3.0 + reload_s))
    assert rent.reserve(r, work, "export")[0] == 0.0
    st = rent.status(rental, reg, tmp_path, rental["ends"] - reserve_s / 2, work)
    best_train, best_eval = trains[1]
    assert st["reserve_reached"] and st["best_candidate"]["train"] == best_train
    assert st["best_candidate"]["eval"] == best_eval and st["best_candidate"]["delta"] == 0.12
    assert st["deliver_commands"] == [
        f"tuneproof export {best_train}",
        f"tuneproof verify exports/{best_train}",
        "tuneproof report",
    ]
    assert st["next"] == f"deliver {best_train}: tuneproof rental deliver (export, verify, report)"
    early = rent.status(rental, reg, tmp_path, T0 + 3600, work)
    assert not early["reserve_reached"] and early["next"].startswith("tuneproof data check")


def test_a_window_started_before_anything_was_measured_plans_from_stated_defaults(tmp_path):
    reg = Registry(tmp_path)
    work = {"steps": 100, "checkpoint_every": 50, "n_eval": 200, "n_test": 100}
    rental = rent.start(tmp_path, reg, days=7, ends=None, now=T0, work=work)
    r = rental["rates"]
    assert (r["s_per_step"], r["eval_s_per_example"], r["reload_s"]) == (10.0, 1.0, 300.0)
    assert r["rate_kinds"] == {"s_per_step": "default", "eval_s_per_example": "default", "reload_s": "default"}
    assert r["step_source"] == "default: nothing measured yet, run tuneproof preflight"
    assert rental["plan"]["steps_per_variant"] == 100 and rental["ends"] == T0 + 7 * 86400
    with pytest.raises(TuneproofError, match="a rental window is already recorded"):
        rent.start(tmp_path, reg, days=7, ends=None, now=T0, work=work)
    with pytest.raises(TuneproofError, match="not an ISO-8601 time"):
        rent.parse_ends("next friday")
    assert rent.parse_ends("2030-03-20T17:46:40") == rent.parse_ends("2030-03-20T18:46:40+01:00") == T0 + 3 * 86400


def test_the_status_screen_keeps_each_number_with_its_name_at_80_columns(tmp_path, monkeypatch, capsys):
    """The first line ('...: 72.0 h left; reserve needed' / '0.42 h') and the default rates' lines
    ('(default 1 (nothing measured yet: run tuneproof' / 'preflight))') were wrapped at 80 columns."""
    from tuneproof.recipes.rental import print_status

    reg = Registry(tmp_path)
    work = {"steps": 40, "checkpoint_every": 10, "n_eval": 7, "n_test": 140}
    rental = rent.start(tmp_path, reg, days=3, ends=None, now=T0, work=work)
    monkeypatch.setattr(console, "_width", 80)
    capsys.readouterr()
    print_status(rent.status(rental, reg, tmp_path, T0 + 3600, work))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "rental ends 2030-03-20 17:46 UTC: 71.0 h left; reserve needed 0.46 h"
    assert "step time: 10 s (default: nothing measured yet, run tuneproof preflight)" in lines
    assert "evaluation: 1 s/example (default: nothing measured yet, run tuneproof preflight)" in lines
