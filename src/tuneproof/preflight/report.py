"""The preflight's check records and the report that collects them.

Every check is one dict ``{"name", "passed", "numbers", "message", "details"}`` (plus ``seconds``,
and ``warning`` where a check flags something without failing); ``passed`` is True, False or None
(skipped). :class:`PreflightReport` prints each check as one row of the preflight's table as it is
added (its verdict and :func:`headline`: the number that matters; every number and the whole
message are in ``preflight.json``) and turns a check that raises into its failure, so the other
checks still run.
"""

from __future__ import annotations

import gc
import time
import traceback
from collections.abc import Callable
from typing import Any

from rich.table import Table

from tuneproof.io import fault_cause
from tuneproof.ui import Heartbeat, console, user_text

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


def _gib(x: Any) -> str:
    return "?" if x is None else f"{x:.2f} GiB" if x >= 1 else f"{x * 1024:.1f} MiB"


def _step_memory(n: dict[str, Any]) -> str | None:
    lengths = sorted(
        int(k[1:].split("_")[0]) for k in n if k.startswith("L") and k.endswith("_peak_gib") and "step" not in k
    )
    if not lengths:
        return None
    top = lengths[-1]
    ratio = n.get(f"L{top}_measured_over_estimate")
    return (
        f"peak {_gib(n.get(f'L{top}_peak_gib'))} of {_gib(n.get('budget_gib'))} at micro-batch {n.get('micro_batch')}, "
        f"length {top}" + (f"; measured / estimated {ratio:.2f}" if isinstance(ratio, (int, float)) else "")
    )


def _eval_memory(n: dict[str, Any]) -> str | None:
    if n.get("peak_gib") is None:
        return None
    return f"peak {_gib(n['peak_gib'])} of {_gib(n.get('budget_gib'))} at eval.batch_size {n.get('batch_size')}"


def _accumulation(n: dict[str, Any]) -> str | None:
    if n.get("grad_max_abs_diff") is None:
        return None
    return (
        f"{n.get('micro_batches')} micro-batches equal their concatenation "
        f"(max gradient difference {n['grad_max_abs_diff']:.1e})"
    )


def _smoke(n: dict[str, Any]) -> str | None:
    if n.get("identical_after_reload") is None:
        return None
    return (
        f"{n.get('steps')} steps; {n['identical_after_reload']} of {n.get('eval_examples')} predictions "
        "identical after a reload in a fresh process"
    )


def _combination(n: dict[str, Any]) -> str | None:
    losses = n.get("losses") or []
    if not losses:
        return None
    return (
        f"{n.get('steps')} steps at micro-batch {n.get('micro_batch')} x {n.get('accumulation')}: loss "
        + " -> ".join(f"{x:.4f}" for x in (losses[0], losses[-1]))
    )


def _speedups_auto(n: dict[str, Any]) -> str | None:
    if n.get("off") is None:  # a record written before ``off`` was: the message's first clause
        return None
    used, off = (str(n.get(k) or "none").replace(",", ", ") for k in ("used", "off"))
    return f"used: {used}; off: {off} (why each: preflight.json, the dossier)"


#: the number that matters, per check, from its ``numbers`` (checks not named here: the first clause
#: of the message)
HEADLINES = {
    "step memory": _step_memory,
    "eval memory": _eval_memory,
    "gradient accumulation": _accumulation,
    "smoke pass": _smoke,
    "configured combination": _combination,
    "speedups auto": _speedups_auto,
}

#: characters of a headline taken from a message (the first clause, cut at a word)
HEADLINE_CHARS = 90


def headline(check: dict[str, Any]) -> str:
    """One line for a check's row: for the checks in :data:`HEADLINES` the number that matters (the
    peak against the budget, the gradient difference ...), else the message's first clause (up to
    ``; ``), cut at a word after :data:`HEADLINE_CHARS` characters; a failed check's whole message
    is printed below the table."""
    if check.get("passed") is not False:
        fn = HEADLINES.get(check["name"])
        try:
            got = fn(check.get("numbers") or {}) if fn else None
        except (TypeError, ValueError, KeyError):  # a record written by an older version
            got = None
        if got:
            return got
    first = str(check.get("message") or "").split("; ")[0]
    if len(first) > HEADLINE_CHARS:
        first = first[:HEADLINE_CHARS].rsplit(" ", 1)[0] + " ..."
    return first


#: the width of the check-name column of the preflight's table
NAME_WIDTH = 25
TAGS = {True: "[green]pass[/]", False: "[red]FAIL[/]", None: "[dim]skip[/]"}


def print_row(check: dict[str, Any]) -> None:
    """One row of the preflight's table: verdict, check, :func:`headline` (wrapped, never cut)."""
    t = Table(show_header=False, box=None, padding=(0, 1, 0, 0), pad_edge=False)
    t.add_column(width=4, no_wrap=True)
    t.add_column(width=NAME_WIDTH)
    t.add_column(overflow="fold")
    t.add_row(TAGS[check["passed"]], check["name"], user_text(headline(check), limit=None))
    console.print(t)


def print_header(title: str) -> None:
    """The table's title and column names, printed before its first row."""
    console.print(f"[bold]{title}[/]")
    console.print(f"[dim]{'':4} {'check':{NAME_WIDTH}} the number that matters[/]")


def error_message(err: BaseException) -> str:
    """``"error: Type: first line of the message"``, the message of a check that raised."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return f"error: {type(err).__name__}: {text}"


class PreflightReport:
    """The checks collected so far; each is printed as it is added."""

    def __init__(self, beat: Heartbeat | None = None) -> None:
        self.checks: list[dict[str, Any]] = []
        self._mark = time.perf_counter()
        self.beat = beat  # says which check runs, off a terminal (ui.heartbeat)

    def add(self, check: dict[str, Any]) -> dict[str, Any]:
        """Record ``check`` (with ``seconds`` since the previous one, unless set), print it; returns it."""
        now = time.perf_counter()
        check.setdefault("seconds", round(now - self._mark, 2))  # wall-clock since the previous check
        self._mark = now
        self.checks.append(check)
        print_row(check)
        if check.get("warning"):
            console.print(f"     [yellow]warning[/] {user_text(check['warning'], limit=None)}", soft_wrap=True)
        if self.beat is not None:
            self.beat.update(f"after {check['name']} ({len(self.checks)} checks done)")
            self.beat.touch()
        return check

    def run(self, name: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """Run one check; an exception inside it is the check's failure (recorded with its traceback).

        Raises:
            OSError: a fault of the machine (disk full, read-only file system: :func:`tuneproof.io.fault_cause`),
                not of the check; the run fails with it.
        """
        if self.beat is not None:
            self.beat.update(f"{name} ({len(self.checks)} checks done)")
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
