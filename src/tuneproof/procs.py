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
"""

from __future__ import annotations

import os
import signal
import sys

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
    import ctypes  # noqa: PLC0415

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != int(expected):  # the parent died before the prctl call
        os._exit(1)
    return True


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
