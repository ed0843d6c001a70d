"""The preflight's check records and the report that collects them.

Every check is one dict ``{"name", "passed", "numbers", "message", "details"}`` (plus ``seconds``,
and ``warning`` where a check flags something without failing); ``passed`` is True, False or None
(skipped). :class:`PreflightReport` prints each check as it is added and turns a check that raises
into its failure, so the other checks still run.
"""

from __future__ import annotations

import gc
import time
import traceback
from collections.abc import Callable
from typing import Any

from tuneproof.io import fault_cause
from tuneproof.ui import console, user_text

GIB = 2**30


def check_result(
    name: str,
    passed: bool | None,
    message: str,
    numbers: dict[str, Any] | None = None,
    details: Any = None,
    **extra: Any,
) -> dict[str, Any]:
    """One check record: ``passed`` True/False/None (skipped), ``numbers`` (flat key -> value, shown in the
    table and the summary), ``details`` (anything JSON, kept in ``preflight.json``); ``extra`` keys
    (``warning``, ``normalisation``) are stored alongside."""
    return {"name": name, "passed": passed, "numbers": numbers or {}, "message": message, "details": details, **extra}


def to_gib(n: int | float | None) -> float | None:
    """Bytes as GiB (2**30), rounded to 4 decimals; None stays None."""
    return None if n is None else round(n / GIB, 4)


def is_out_of_memory(err: BaseException) -> bool:
    """True for a ``MemoryError``, torch's (or CUDA's) ``OutOfMemoryError``, or an error saying "out of memory"."""
    import torch  # noqa: PLC0415 - torch loads only when a check runs

    oom = tuple(
        t for t in (getattr(torch, "OutOfMemoryError", None), getattr(torch.cuda, "OutOfMemoryError", None)) if t
    )
    return isinstance(err, MemoryError) or bool(oom and isinstance(err, oom)) or "out of memory" in str(err).lower()


def error_message(err: BaseException) -> str:
    """``"error: Type: first line of the message"``, the message of a check that raised."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return f"error: {type(err).__name__}: {text}"


class PreflightReport:
    """The checks collected so far; each is printed as it is added."""

    def __init__(self) -> None:
        self.checks: list[dict[str, Any]] = []
        self._mark = time.perf_counter()

    def add(self, check: dict[str, Any]) -> dict[str, Any]:
        """Record ``check`` (with ``seconds`` since the previous one, unless set), print it; returns it."""
        now = time.perf_counter()
        check.setdefault("seconds", round(now - self._mark, 2))  # wall-clock since the previous check
        self._mark = now
        self.checks.append(check)
        tag = {True: "[green]pass[/]", False: "[red]FAIL[/]", None: "[dim]skip[/]"}[check["passed"]]
        console.print(f"{tag} {check['name']}: {user_text(check['message'])}", soft_wrap=True)
        if check.get("warning"):
            console.print(f"[yellow]warning[/] {user_text(check['warning'])}", soft_wrap=True)
        return check

    def run(self, name: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """Run one check; an exception inside it is the check's failure (recorded with its traceback).

        Raises:
            OSError: a fault of the machine (disk full, read-only file system: :func:`tuneproof.io.fault_cause`),
                not of the check; the run fails with it.
        """
        try:
            return self.add(fn())
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as err:  # noqa: BLE001 - a crash of a check is its verdict
            if fault_cause(err):
                raise
            if is_out_of_memory(err):
                gc.collect()
            return self.add(
                check_result(name, False, error_message(err), details={"traceback": traceback.format_exc()})
            )

    def skip(self, name: str, why: str) -> None:
        """Record ``name`` as skipped (``passed`` None) because of ``why``."""
        self.add(check_result(name, None, f"skipped: {why}"))

    def get(self, name: str) -> dict[str, Any] | None:
        """The recorded check called ``name``, or None."""
        return next((c for c in self.checks if c["name"] == name), None)

    @property
    def failed(self) -> list[dict[str, Any]]:
        """The checks that failed (``passed`` False), in order."""
        return [c for c in self.checks if c["passed"] is False]
