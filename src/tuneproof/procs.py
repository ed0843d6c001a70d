"""Child processes that die with their parent.

tuneproof starts fresh Python processes to prove that a result does not depend on the memory of
the current one (``export``'s verification, ``preflight``'s reload check). When the parent is
killed (``kill -9``, OOM killer), such a child must not live on as an orphan:

- the parent puts its pid in the child's environment (:func:`child_env`);
- the child's first act is :func:`die_with_parent`: on Linux it asks the kernel to send it SIGKILL
  when the parent dies (``prctl(PR_SET_PDEATHSIG, SIGKILL)``, prctl(2)), then checks that the
  parent is still its parent (it may have died before the call) and exits at once otherwise.

On SIGTERM/SIGINT the parent's ``subprocess.run`` already kills the child (it kills the child on
any exception, see the subprocess documentation), so both ways out are covered. Other systems have
no PR_SET_PDEATHSIG: there, only the parent-side kill applies.

A program that is not tuneproof's (torchrun) is started through ``python -m tuneproof.procs CMD ...``
(:func:`exec_dying_with_parent`): the wrapper makes itself die with its parent, then becomes ``CMD``
(exec keeps the pid and the death signal) with :data:`PARENT_ENV` set to its own pid, so that the
processes ``CMD`` starts (torchrun's ranks) die with it in turn by calling :func:`die_with_parent`.

The processes of a run record themselves in its folder (:func:`record`, ``proc-<name>.json``: pid,
host, kernel start time), so that a command that would write the same run (``resume``) can tell
whether any of them still lives (:func:`live_processes`).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import sys
from pathlib import Path

PARENT_ENV = "TUNEPROOF_PARENT_PID"
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's environment) plus :data:`PARENT_ENV` = this pid."""
    out = dict(os.environ if env is None else env)
    out[PARENT_ENV] = str(os.getpid())
    return out


def die_with_parent() -> bool:
    """In a child started with :func:`child_env`: die (SIGKILL) when the parent dies.

    Returns True when the kernel will do it (Linux, parent pid given), False otherwise. Exits
    with code 1 at once when the parent is already gone.
    """
    expected = os.environ.get(PARENT_ENV)
    if not expected or not sys.platform.startswith("linux"):
        return False

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != int(expected):  # the parent died before the prctl call
        os._exit(1)
    return True


def process_start(pid: int) -> str | None:
    """The kernel start time of ``pid`` (field 22 of /proc/PID/stat, clock ticks since boot), to tell a
    reused pid apart; None where /proc has no such process (or no /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def alive(pid: int, start: str | None = None) -> bool:
    """Whether process ``pid`` of this machine lives (a zombie counts as gone) and, when ``start``
    (:func:`process_start` as recorded) is given, is still the process recorded (not a reused pid). A pid
    below 1 names no one process (``kill(0)`` would signal a group): not alive."""
    if pid < 1:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OverflowError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        state = ""
    if state == "Z":
        return False
    if start is not None and Path("/proc").exists():
        return process_start(pid) == start
    return True


def exec_dying_with_parent(argv: list[str]) -> None:
    """Become ``argv`` (``os.execvp``) after :func:`die_with_parent`, with :data:`PARENT_ENV` set to this
    pid (which ``argv`` keeps), so that its own children can die with it. Never returns.

    Raises:
        SystemExit: no command given (code 2).
    """
    if not argv:
        raise SystemExit("usage: python -m tuneproof.procs CMD [ARG...]")
    die_with_parent()
    os.environ[PARENT_ENV] = str(os.getpid())
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvp(argv[0], argv)


def dying_with_parent(argv: list[str], env: dict[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """``(command, environment)`` that run ``argv`` through ``python -m tuneproof.procs`` (it dies with this
    process, :func:`exec_dying_with_parent`): :func:`child_env` of ``env``, with this tuneproof importable
    (its folder first on ``PYTHONPATH``)."""
    out = child_env(env)
    src = str(Path(__file__).resolve().parents[1])
    out["PYTHONPATH"] = src + (os.pathsep + out["PYTHONPATH"] if out.get("PYTHONPATH") else "")
    return [sys.executable, "-m", "tuneproof.procs", *argv], out


PROC_PREFIX = "proc-"  # runs/<id>/proc-<name>.json: one process of the run (:func:`record`)


def record(folder: str | os.PathLike, name: str, pid: int | None = None) -> Path:
    """Write ``<folder>/proc-<name>.json`` (``{"name", "pid", "host", "proc_start"}``) for process ``pid``
    (default: this one), replacing that name's earlier record. Written whole (temp file + rename)."""
    pid = os.getpid() if pid is None else pid
    path = Path(folder) / f"{PROC_PREFIX}{name}.json"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    body = {"name": name, "pid": pid, "host": socket.gethostname(), "proc_start": process_start(pid)}
    tmp.write_text(json.dumps(body) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def live_processes(folder: str | os.PathLike) -> list[dict]:
    """The processes recorded in ``folder`` (:func:`record`) that still live on this host (same pid and
    kernel start time), each ``{"name", "pid", "host", "proc_start"}``; a damaged record is skipped.
    Those of another host cannot be seen from here and are not returned."""
    out = []
    here = socket.gethostname()
    for path in sorted(Path(folder).glob(f"{PROC_PREFIX}*.json")):
        try:
            rec = json.loads(path.read_text(encoding="utf-8"))
            pid = int(rec["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if rec.get("host") == here and pid != os.getpid() and alive(pid, rec.get("proc_start")):
            out.append(rec)
    return out


def usable_cores() -> int:
    """CPU cores this process may run on (``os.sched_getaffinity`` where the platform has it, which
    respects a container's or ``taskset``'s limit; else ``os.cpu_count()``; at least 1)."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except (AttributeError, OSError):
        return max(os.cpu_count() or 1, 1)


def overload_line(load: float | None = None, cores: int | None = None) -> str | None:
    """A warning when the machine is overloaded: the 1-minute load average (``os.getloadavg``,
    runnable processes) above the usable cores, e.g. ``"this machine is overloaded: load average
    10.2 over the last minute on 2 cores; every step takes longer than on an idle machine"``.
    None when it is not, or where the platform has no load average (Windows)."""
    if load is None:
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):
            return None
    cores = cores or usable_cores()
    if load <= cores:
        return None
    return (
        f"this machine is overloaded: load average {load:.1f} over the last minute on {cores} "
        f"core{'s' if cores != 1 else ''}; every step takes longer than on an idle machine"
    )


if __name__ == "__main__":
    exec_dying_with_parent(sys.argv[1:])
