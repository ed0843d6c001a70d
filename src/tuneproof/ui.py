"""Console output: one Rich console, progress bars, tables."""

from __future__ import annotations

import contextlib
from typing import Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

console = Console(highlight=False)


@contextlib.contextmanager
def progress_bar(description: str, total: int) -> Iterator:
    """A Rich progress bar; yields ``advance(n=1, **fields)``."""
    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=False,
    ) as prog:
        task = prog.add_task(description, total=total, info="")

        def advance(n: int = 1, info: str = "") -> None:
            prog.update(task, advance=n, info=info)

        yield advance


def table(title: str, columns: list[str], rows: list[list]) -> Table:
    t = Table(title=title, title_justify="left")
    for c in columns:
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(*["" if v is None else str(v) for v in r])
    return t


def fmt(x, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)
