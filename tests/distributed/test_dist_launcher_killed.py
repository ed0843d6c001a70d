"""kill -9 of ``tuneproof train --nproc-per-node 2`` (the launcher) while its ranks train (issue 33 item 15):
torchrun and both ranks die with it, so nothing writes the run the registry then lists as interrupted.
Real torchrun on gloo (the refusal of a resume while one lives: tests/faults/test_faults_launcher.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from dist_helpers import SKIP, SRC, dist_study
from tiny_study import cli_env
from tuneproof import procs
from tuneproof.registry import Registry

# every micro-batch takes a while, so that the ranks are mid-training when the launcher is killed
SLOW = textwrap.dedent(
    """
    import os, time
    if os.environ.get("RANK") is not None:
        import tuneproof.training.loop as L
        _orig = L._micro_loss
        def _micro_loss(*a, **kw):
            time.sleep(0.3)
            return _orig(*a, **kw)
        L._micro_loss = _micro_loss
    """
)


def _wait(cond, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.5)
    return False


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_kill_9_of_the_launcher_takes_torchrun_and_the_ranks_with_it(tiny_base, tmp_path):
    study = dist_study(tmp_path / "s", tiny_base, max_steps=400, micro_batch_size=2, gradient_accumulation_steps=2)
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SLOW)
    env = cli_env()
    env["PYTHONPATH"] = os.pathsep.join([str(hook), str(SRC)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    launcher = subprocess.Popen(
        [sys.executable, "-c", "from tuneproof.cli import main; main()", "train", "--study", str(study)]
        + ["--skip-preflight", "kill -9 test", *SKIP, "--nproc-per-node", "2"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    run_dir = study / "runs" / "r0001"
    try:
        names = ["torchrun", "rank-0", "rank-1"]
        started = _wait(
            lambda: (
                (run_dir / "metrics.jsonl").is_file() and all((run_dir / f"proc-{n}.json").is_file() for n in names)
            ),
            300,
        )
        assert started, sorted(os.listdir(run_dir)) if run_dir.is_dir() else "no run folder"
        live = procs.live_processes(run_dir)
        assert sorted(p["name"] for p in live) == sorted(names)
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        assert _wait(lambda: not procs.live_processes(run_dir), 30), procs.live_processes(run_dir)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        for p in procs.live_processes(run_dir):
            os.kill(p["pid"], signal.SIGKILL)
    rec = Registry(study).get("r0001")
    assert rec.status == "interrupted" and rec.reason.startswith("process died without recording an end (found stale)")
    size = (run_dir / "metrics.jsonl").stat().st_size
    time.sleep(2)
    assert (run_dir / "metrics.jsonl").stat().st_size == size  # nobody writes the run any more
