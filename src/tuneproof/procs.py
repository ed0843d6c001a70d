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

import ctypes
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

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != int(expected):  # the parent died before the prctl call
        os._exit(1)
    return True
