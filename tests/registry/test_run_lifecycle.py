"""The run lifecycle: running -> completed | failed | interrupted | invalid, with reasons; a run
left running by a killed process is found stale; an interrupted run can be reopened (resume);
no status is hidden from ``runs``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tuneproof.cli import main
from tuneproof.errors import TuneproofError
from tuneproof.registry import Registry

SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, time
    from tuneproof.registry import Registry
    reg = Registry(sys.argv[1])
    with reg.run("train", name="child") as run:
        run.summary["last_step"] = 7
        if len(sys.argv) > 3:  # a checkpoint written before the kill
            (run.dir / "checkpoints" / "step-2").mkdir(parents=True)
        os.kill(os.getpid(), getattr(signal, sys.argv[2]))
        time.sleep(30)
    """
)


def _child(study, signal_name: str, *checkpoint: str) -> subprocess.CompletedProcess:
    """A process that starts a run, reaches step 7 (with ``checkpoint``: writes ``checkpoints/step-2``) and sends
    itself ``signal_name``."""
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, str(study), signal_name, *checkpoint], capture_output=True, text=True, timeout=60
    )


def test_sigkill_leaves_a_running_run_that_is_found_stale(tmp_path):
    proc = _child(tmp_path, "SIGKILL")
    assert proc.returncode == -9
    reg = Registry(tmp_path)  # opening the index checks the pids of running runs
    rec = reg.get("r0001")
    assert rec.status == "interrupted" and rec.reason == "process died without recording an end (found stale)"
    assert rec.ended is not None


def test_a_stale_train_run_with_a_checkpoint_says_how_to_resume(tmp_path, capsys, monkeypatch):
    proc = _child(tmp_path, "SIGKILL", "ckpt")
    assert proc.returncode == -9
    rec = Registry(tmp_path).get("r0001")
    assert rec.status == "interrupted" and rec.reason == (
        "process died without recording an end (found stale); resume with: tuneproof resume r0001-child"
    )
    # a run marked interrupted by hand (no hint in its reason) gets the next step in `runs`
    reg = Registry(tmp_path)
    with reg.run("train") as run:
        (run.dir / "checkpoints" / "step-4").mkdir(parents=True)
        reg.mark_stale()  # alive: not stale
    reg.finish(run.id, "interrupted", "machine lost")
    from tuneproof.ui import console

    monkeypatch.setattr(console, "_width", 250)
    with pytest.raises(SystemExit):
        main(["runs", "--study", str(tmp_path)])
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if run.id in x)
    assert "machine lost" in line and out.count(f"resume with: tuneproof resume {run.id}") == 1
    assert out.count("resume with: tuneproof resume r0001-child") == 1


def test_sigterm_marks_the_run_interrupted_with_its_last_step(tmp_path):
    proc = _child(tmp_path, "SIGTERM")
    assert proc.returncode != 0
    rec = Registry(tmp_path).get("r0001-child")
    assert rec.status == "interrupted" and rec.reason == "terminated (signal 15) at step 7"


def test_statuses_in_process(tmp_path):
    reg = Registry(tmp_path)
    with reg.run("train") as run:
        pass
    assert reg.get(run.id).status == "completed"
    with pytest.raises(KeyboardInterrupt):
        with reg.run("train") as run:
            raise KeyboardInterrupt
    assert (reg.get(run.id).status, reg.get(run.id).reason) == ("interrupted", "interrupted by Ctrl-C")
    with pytest.raises(ValueError):
        with reg.run("train") as run:
            raise ValueError("boom\nsecond line")
    assert (reg.get(run.id).status, reg.get(run.id).reason) == ("failed", "ValueError: boom")
    with reg.run("eval") as run:
        reg.invalidate(run.id, "a check said so")
    assert (reg.get(run.id).status, reg.get(run.id).reason) == ("invalid", "a check said so (was running)")


def test_the_error_that_ends_a_run_names_it(tmp_path):
    reg = Registry(tmp_path)
    with pytest.raises(TuneproofError) as err:
        with reg.run("eval"):
            raise TuneproofError("data/valid.jsonl:3: label 'x' is not a class", hint="fix the row")
    assert str(err.value) == "data/valid.jsonl:3: label 'x' is not a class (run r0001)\n  -> fix the row"
    assert reg.get("r0001").status == "failed"
    with pytest.raises(TuneproofError) as err:  # a message that names its run already is left as it is
        with reg.run("preflight") as run:
            raise TuneproofError(f"preflight {run.id}: 1 of 9 checks failed")
    assert str(err.value) == "preflight r0002: 1 of 9 checks failed"


def test_a_live_run_is_not_stale_but_a_reused_pid_is(tmp_path):
    reg = Registry(tmp_path)
    run = reg.create("train")
    assert reg.mark_stale() == [] and reg.get(run.id).status == "running"
    reg._update(run.id, proc_start="not-this-process")  # same pid, another process start time
    if os.path.exists("/proc"):
        assert reg.mark_stale() == [run.id] and reg.get(run.id).status == "interrupted"


def test_reopen_continues_an_interrupted_run_in_this_process(tmp_path):
    reg = Registry(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        with reg.run("train") as run:
            run.update_summary(last_step=3, steps=3)
            raise KeyboardInterrupt("stop_after=3")
    rec = reg.get(run.id)
    assert rec.reason == "interrupted (stop_after=3) at step 3"
    with reg.reopen(rec.id) as again:
        assert reg.get(rec.id).status == "running" and again.summary["steps"] == 3
        again.update_summary(steps=5)
    rec = reg.get(rec.id)
    assert (rec.status, rec.reason, rec.summary["steps"], rec.summary["last_step"]) == ("completed", None, 5, 3)
    with pytest.raises(TuneproofError, match="is completed"):
        with reg.reopen(rec.id):
            pass
    assert (
        "resume (was interrupted: interrupted (stop_after=3) at step 3)"
        in (tmp_path / "runs" / rec.id / "log.txt").read_text()
    )


def test_no_status_is_hidden_from_runs(tmp_path, capsys):
    from tuneproof.ui import console

    reg = Registry(tmp_path)
    with reg.run("baseline"):
        pass
    with pytest.raises(KeyboardInterrupt), reg.run("train"):
        raise KeyboardInterrupt
    with pytest.raises(RuntimeError), reg.run("train"):
        raise RuntimeError("out of memory")
    reg.create("train")  # running, in this live process
    with pytest.raises(SystemExit) as exit_:
        main(["invalidate", "r0001", "--why", "wrong split used", "--study", str(tmp_path)])
    assert exit_.value.code == 0
    old, console.width = console._width, 250
    try:
        for args in (["runs"], ["runs", "--tree"]):
            with pytest.raises(SystemExit) as exit_:
                main([*args, "--study", str(tmp_path)])
            out = capsys.readouterr().out
            assert exit_.value.code == 0
            for text in (
                "invalid",
                "wrong split used (was completed)",
                "interrupted by Ctrl-C",
                "failed",
                "RuntimeError: out of memory",
                "running",
                "r0001",
                "r0002",
                "r0003",
                "r0004",
            ):
                assert text in out, (args, text)
    finally:
        console._width = old
