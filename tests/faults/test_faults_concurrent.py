"""Concurrent commands on one study (docs/CASES.md, faults of the machine): two exports of one bundle at once, the
second refused in one line while the first holds the bundle's lock; the first killed with kill -9 leaves its temp
folder (and its lock file) beside ``--out``, recorded in its export run, and the next run removes them."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tuneproof.cli import main
from tuneproof.registry import Registry

pytestmark = pytest.mark.filterwarnings("ignore")

HELD = textwrap.dedent(
    """
    import os, sys, time
    import tuneproof.recipes.export as export
    from tuneproof.cli import main

    def held(ctx, rec, tmp, **kw):  # writing the bundle (as a large model would for minutes) until killed
        (tmp / "adapter").mkdir()
        (tmp / "adapter" / "adapter_model.safetensors").write_bytes(bytes(4096))
        open(os.environ["READY"], "w").write(str(os.getpid()))
        time.sleep(600)

    export.build_bundle = held
    main(sys.argv[1:])
    """
)


def _run(capsys, *argv) -> tuple[int, str]:
    with pytest.raises(SystemExit) as e:
        main(list(argv))
    out = capsys.readouterr()
    return e.value.code, out.out + out.err


@pytest.mark.fault("race: two exports of one bundle; a killed export's temp folder")
def test_a_second_export_of_one_bundle_is_refused_and_a_killed_ones_folder_is_removed_next(evaluated, tmp_path, capsys):
    from tiny_study import cli_env

    study = tmp_path / "s"
    shutil.copytree(evaluated["dir"], study)
    train, out = evaluated["train"], tmp_path / "bundle"
    args = ["export", train, "--study", str(study), "--out", str(out), "--verify-examples", "2"]
    ready = tmp_path / "ready"
    first = subprocess.Popen(
        [sys.executable, "-c", HELD, *args],
        env={**cli_env(), "READY": str(ready)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        for _ in range(600):
            if ready.exists() or first.poll() is not None:
                break
            time.sleep(0.2)
        assert ready.exists(), first.communicate()[0]
        (exp,) = Registry(study).list(kind="export")
        assert exp.status == "running" and exp.summary["temp_folder"] == str(tmp_path / f".bundle.{exp.id}.tmp-export")

        code, said = _run(capsys, *args)
        assert code == 2, said
        lines = said.strip().splitlines()
        assert lines[0] == (
            f"error: {out}: another export is writing this bundle now "
            f"(pid {first.pid}, lock {tmp_path / '.bundle.lock'})"
        )
        assert len(lines) == 2 and "Traceback" not in said and "Directory not empty" not in said
        assert len(Registry(study).list(kind="export")) == 1  # refused before a run was made
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)

    leftovers = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".bundle"))
    assert leftovers == [".bundle.lock", f".bundle.{exp.id}.tmp-export"]  # what kill -9 leaves
    reg = Registry(study)  # the next run of any command cleans up; the lock file is free again
    assert reg.get(exp.id).status == "interrupted"
    with reg.run("eval"):
        pass
    said = capsys.readouterr().err
    assert (
        "note: removed 2 stale temporary file(s) left by a killed process: "
        f"{tmp_path / f'.bundle.{exp.id}.tmp-export'}, {tmp_path / '.bundle.lock'}"
    ) in said
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".bundle")) == []
    assert not out.exists()


@pytest.mark.fault("race: two resumes of one run")
def test_two_resumes_of_one_run_at_once_the_second_is_refused(tmp_path, monkeypatch):
    """Both saw the run interrupted; the first to set it running continues it, the other refuses in one line."""
    from tuneproof.errors import TuneproofError

    reg, other = Registry(tmp_path), Registry(tmp_path)
    run = reg.create("train")
    reg.finish(run.id, "interrupted", "terminated (signal 15)")
    seen = reg.get(run.id)  # what the second resume checked before the first took the run
    with other.reopen(run.id):
        monkeypatch.setattr(reg, "get", lambda run_id: seen)
        with pytest.raises(TuneproofError) as err, reg.reopen(run.id):
            pytest.fail("two processes continue one run")
        monkeypatch.undo()
        assert err.value.message == (
            f"run {run.id} is running (another process took it over just now: "
            f"live process pid {os.getpid()} on this host)"
        )
        assert reg.get(run.id).status == "running"
    assert reg.get(run.id).status == "completed"
