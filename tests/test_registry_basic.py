"""Run ids, statuses and the run folder."""

from __future__ import annotations

import pytest

from tuneproof.errors import TuneproofError
from tuneproof.registry import Registry


def test_ids_are_sequential_and_named(tmp_path):
    reg = Registry(tmp_path)
    a = reg.create("baseline")
    b = reg.create("train", parent=a.id, name="lora-r16")
    assert (a.id, b.id) == ("r0001", "r0002-lora-r16")
    assert reg.get("r0002").id == "r0002-lora-r16"  # the short prefix resolves
    assert reg.get(b.id).parent == "r0001"
    assert (tmp_path / "runs" / "r0002-lora-r16").is_dir()


def test_completed_and_failed_runs_are_recorded(tmp_path):
    reg = Registry(tmp_path)
    with reg.run("eval") as ok:
        ok.update_summary(metrics={"accuracy": 0.5})
    with pytest.raises(ValueError):
        with reg.run("train") as bad:
            raise ValueError("boom at step 3")
    assert reg.get(ok.id).status == "completed"
    assert reg.get(ok.id).summary["metrics"] == {"accuracy": 0.5}
    rec = reg.get(bad.id)
    assert rec.status == "failed" and rec.reason == "ValueError: boom at step 3"
    assert [r.id for r in reg.list()] == [ok.id, bad.id]


def test_ctrl_c_marks_interrupted_with_last_step(tmp_path):
    reg = Registry(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        with reg.run("train") as run:
            run.summary["last_step"] = 7
            raise KeyboardInterrupt
    rec = reg.get(run.id)
    assert rec.status == "interrupted" and rec.reason == "interrupted by Ctrl-C at step 7"


def test_invalidate_keeps_the_run_and_the_prior_status(tmp_path):
    reg = Registry(tmp_path)
    with reg.run("train") as run:
        pass
    rec = reg.invalidate(run.id, "wrong split used")
    assert rec.status == "invalid" and rec.reason == "wrong split used (was completed)"
    assert len(reg.list()) == 1


def test_unknown_run_id_is_a_clear_error(tmp_path):
    reg = Registry(tmp_path)
    reg.create("baseline")
    with pytest.raises(TuneproofError, match="run 'r0042' does not exist"):
        reg.get("r0042")
