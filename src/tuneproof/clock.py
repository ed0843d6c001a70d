"""The one time source of tuneproof: every recorded time (run start and end, heartbeats, the rental
window, metrics rows) is read through :func:`now`, so that a test replaces the clock with
:func:`use` instead of sleeping.

A running train run can be asked to stop at a time (the rental's reserve,
:mod:`tuneproof.recipes.rental`): :func:`stop_at` stores the time and its reason in the
environment (:data:`STOP_AT_ENV`), so processes started under torchrun read it too;
:func:`stop_reason` is what the training loop asks at each step boundary.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator

STOP_AT_ENV = "TUNEPROOF_STOP_AT"  # "<seconds since the epoch> <reason>"

_source: Callable[[], float] = time.time


def now() -> float:
    """Seconds since the epoch (UTC), from the machine's clock or the one :func:`use` put in place."""
    return float(_source())


@contextlib.contextmanager
def use(source: Callable[[], float]) -> Iterator[None]:
    """Read time from ``source`` (a zero-argument callable returning seconds since the epoch) inside
    the block; the machine's clock again after it."""
    global _source
    old, _source = _source, source
    try:
        yield
    finally:
        _source = old


@contextlib.contextmanager
def stop_at(when: float | None, reason: str) -> Iterator[None]:
    """Inside the block, :func:`stop_reason` returns ``reason`` once :func:`now` reaches ``when``
    (seconds since the epoch; None: no stop time)."""
    old = os.environ.get(STOP_AT_ENV)
    if when is None:
        os.environ.pop(STOP_AT_ENV, None)
    else:
        os.environ[STOP_AT_ENV] = f"{when!r} {reason}"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(STOP_AT_ENV, None)
        else:
            os.environ[STOP_AT_ENV] = old


def stop_reason() -> str | None:
    """The reason to stop now (``"stopped: rental reserve"``), or None while the stop time is ahead
    or none is set. A malformed value is ignored (None)."""
    raw = os.environ.get(STOP_AT_ENV)
    if not raw:
        return None
    when, _, reason = raw.partition(" ")
    try:
        at = float(when)
    except ValueError:
        return None
    return (reason or "stopped") if now() >= at else None
