"""Console output: one Rich console, progress bars, tables."""

from __future__ import annotations

import contextlib
import os
import time
from typing import Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

console = Console(highlight=False)


#: seconds between two plain progress lines when stdout is not a terminal ($TUNEPROOF_PROGRESS_EVERY)
PROGRESS_EVERY_S = 30.0


class LineProgress:
    """Progress as plain lines for logs, CI and ``nohup`` (no terminal to redraw a bar in).

    One line when ``every_s`` seconds have passed since the last line, at each further 10 % of
    ``total``, and at the end: ``train: 40/400 (10%) loss 1.234 | 2.1 it/s | elapsed 0:00:19 | ETA 0:02:51``.
    """

    def __init__(self, description: str, total: int, *, every_s: float | None = None, out=None, clock=time.monotonic):
        self.description, self.total, self.done = description, max(int(total), 0), 0
        self.every_s = float(os.environ.get("TUNEPROOF_PROGRESS_EVERY", PROGRESS_EVERY_S)) if every_s is None else every_s
        self.out = out or (lambda line: console.print(line, markup=False, highlight=False, soft_wrap=True))
        self.clock = clock
        self.start = self.last = clock()
        self.next_decile = 1

    @staticmethod
    def _hms(seconds: float) -> str:
        seconds = int(round(seconds))
        return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"

    def line(self, info: str = "") -> str:
        elapsed = self.clock() - self.start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        pct = f" ({100 * self.done // self.total}%)" if self.total else ""
        eta = self._hms((self.total - self.done) / rate) if rate > 0 and self.total else "?"
        return (f"{self.description}: {self.done}/{self.total}{pct}" + (f" {info}" if info else "")
                + f" | {rate:.2f} it/s | elapsed {self._hms(elapsed)} | ETA {eta}")

    def advance(self, n: int = 1, info: str = "") -> None:
        self.done += n
        now = self.clock()
        decile = 10 * self.done // self.total if self.total else 0
        if self.done >= self.total or now - self.last >= self.every_s or decile >= self.next_decile:
            self.out(self.line(info))
            self.last = now
            self.next_decile = decile + 1


@contextlib.contextmanager
def progress_bar(description: str, total: int) -> Iterator:
    """A Rich progress bar on a terminal, else :class:`LineProgress` lines; yields ``advance(n=1, info="")``."""
    if not console.is_terminal:
        yield LineProgress(description, total).advance
        return
    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=False,
    ) as prog:
        task = prog.add_task(description, total=total, info="")

        def advance(n: int = 1, info: str = "") -> None:
            prog.update(task, advance=n, info=info)

        yield advance


#: a column is never narrower than its longest word up to this many characters, so words such as
#: "completed" or "data-check" are not broken at 80 columns; longer tokens (hashes, paths) fold
MAX_UNBROKEN_WORD = 14


def _longest_word(texts) -> int:
    from rich.text import Text  # noqa: PLC0415

    longest = 0
    for text in texts:
        plain = Text.from_markup(text).plain if "[" in text else text
        for word in plain.split():
            longest = max(longest, len(word))
    return min(longest, MAX_UNBROKEN_WORD)


def table(title: str, columns: list[str], rows: list[list]) -> Table:
    """A Rich table whose cells wrap between words (a word up to 14 characters is never cut)."""
    cells = [["" if v is None else str(v) for v in r] for r in rows]
    t = Table(title=title, title_justify="left")
    for i, c in enumerate(columns):
        t.add_column(c, overflow="fold", min_width=_longest_word([c] + [r[i] for r in cells if i < len(r)]))
    for r in cells:
        t.add_row(*r)
    return t


def fmt(x, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)
