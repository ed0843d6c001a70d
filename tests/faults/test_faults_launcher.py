"""kill -9 of a distributed run's launcher (issue 33 item 15): torchrun and its ranks die with it, and
``resume`` refuses while any process of the run lives. The launcher here is the real
:func:`tuneproof.recipes.torchrun.launch`; the program it starts stands in for torchrun (an agent that
starts two ranks, each doing what :func:`tuneproof.recipes.torchrun.worker_main` does first), so the test
runs in seconds without torch.distributed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tuneproof import procs
from tuneproof.errors import TuneproofError
from tuneproof.recipes.resume import run_resume
from tuneproof.registry import Registry

RANK = (
    "import sys, time; from pathlib import Path; from tuneproof import procs; "
    "procs.die_with_parent(); procs.record(Path(sys.argv[1]), 'rank-' + sys.argv[2]); time.sleep(300)"
)
AGENT = (
    "import subprocess, sys, time; "
    "ps = [subprocess.Popen([sys.executable, '-c', sys.argv[2], sys.argv[1], str(i)]) for i in range(2)]; "
    "time.sleep(300)"
)
LAUNCHER = (
    "import sys; from pathlib import Path; from tuneproof.recipes.torchrun import launch; "
    "launch([sys.executable, '-c', sys.argv[2], sys.argv[1], sys.argv[3]], Path(sys.argv[1]))"
)


def _wait(cond, timeout: float = 90.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.2)
    return False


@pytest.mark.fault("leftovers: ranks outliving a killed launcher")
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_kill_9_of_the_launcher_kills_torchrun_and_its_ranks_and_resume_waits_for_them(tmp_path):
    reg = Registry(tmp_path)
    with reg.run("train") as r:
        pass
    reg.finish(r.id, "interrupted", "process died without recording an end (found stale)")
    run_dir = tmp_path / "runs" / r.id
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(run_dir), AGENT, RANK])
    try:
        names = ["proc-rank-0.json", "proc-rank-1.json", "proc-torchrun.json"]
        assert _wait(lambda: all((run_dir / n).is_file() for n in names)), os.listdir(run_dir)
        live = procs.live_processes(run_dir)
        assert [p["name"] for p in live] == ["rank-0", "rank-1", "torchrun"]
        pids = [p["pid"] for p in live]
        # the registry lists the run interrupted, but a resume now would write the same run twice
        with pytest.raises(TuneproofError) as err:
            run_resume(tmp_path, None, r.id)
        assert err.value.message == (
            f"run {r.id} is interrupted, but processes of its last launch still run on this host: "
            f"rank-0 (pid {pids[0]}), rank-1 (pid {pids[1]}), torchrun (pid {pids[2]})"
        )
        assert err.value.hint == "wait for them to end, or stop them: kill -TERM " + " ".join(map(str, pids))
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        assert _wait(lambda: not procs.live_processes(run_dir), 15.0), procs.live_processes(run_dir)
        assert not any(procs.alive(p) for p in pids)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        for p in procs.live_processes(run_dir):
            os.kill(p["pid"], signal.SIGKILL)
    # nothing lives any more: the refusal is gone (the resume goes on to look for a checkpoint)
    with pytest.raises(TuneproofError, match="checkpoint"):
        run_resume(tmp_path, None, r.id)


def test_a_process_record_of_a_dead_or_reused_pid_is_not_alive(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    procs.record(tmp_path, "rank-0", gone.pid)
    procs.record(tmp_path, "rank-1", os.getppid())
    rec = (tmp_path / "proc-rank-1.json").read_text()
    (tmp_path / "proc-rank-1.json").write_text(rec.replace('"proc_start": "', '"proc_start": "1'))  # a reused pid
    (tmp_path / "proc-rank-2.json").write_text("{not json")
    procs.record(tmp_path, "rank-3", 0)  # pid 0 would be this process group to kill(2)
    assert procs.live_processes(tmp_path) == []
    procs.record(tmp_path, "rank-1", os.getppid())
    assert [p["name"] for p in procs.live_processes(Path(tmp_path))] == ["rank-1"]


SLOW_EXIT = (
    "import atexit, sys, time\n"
    "def library_cleanup():  # what torch / MLflow / concurrent.futures register\n"
    "    print('cleanup', flush=True)\n"
    "    time.sleep(30)\n"
    "atexit.register(library_cleanup)\n"
    "sys.argv = ['tuneproof', 'runs', '--help']\n"
    "from tuneproof.cli import main\n"
    "main()\n"
)


@pytest.mark.fault("machine: two Ctrl-C")
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="POSIX signals")
def test_a_second_ctrl_c_while_the_process_exits_ends_it_without_a_traceback(tmp_path):
    """Issue 33 item 17: two Ctrl-C printed 'Exception ignored in atexit callback' and a traceback (the
    second landed in a library's atexit cleanup). It ends the process at once with the command's code."""
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_EXIT], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path
    )
    try:
        for line in proc.stdout:
            if line.strip() == "cleanup":
                break
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert time.monotonic() - t0 < 10  # not the 30 s cleanup
    assert proc.returncode == 0  # the code of the command (runs --help), not a crash
    assert "Traceback" not in err and "Exception ignored" not in err
    assert err.strip() == "Ctrl-C again: exiting without waiting for the libraries' cleanup"
