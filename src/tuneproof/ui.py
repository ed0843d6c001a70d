"""Console output: one Rich console, progress bars, tables."""

from __future__ import annotations

import contextlib
import html
import json
import os
import re
import sys
import threading
import time
from collections.abc import Iterator

from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.errors import MarkupError
from rich.markup import escape as _escape_markup
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text


class WrappingConsole(Console):
    """Rich's console, except that on a terminal a line printed with ``soft_wrap=True`` is still
    wrapped at word boundaries to the terminal's width: off a terminal (a log, a pipe, tests) such a
    line stays whole for grep, but on an 80-column terminal it would be cut mid-word by the terminal."""

    def print(self, *objects, soft_wrap: bool | None = None, **kwargs) -> None:
        if soft_wrap and self.is_terminal:
            soft_wrap = False
        super().print(*objects, soft_wrap=soft_wrap, **kwargs)


console = WrappingConsole(highlight=False)
#: what ends a command early (interruptions) goes to stderr, so that ``--json`` output stays clean
err_console = WrappingConsole(highlight=False, stderr=True)

#: the real stdout of each ``--json`` command running (innermost last): :func:`print_json` writes there
_JSON_STDOUT: list = []


@contextlib.contextmanager
def json_stdout() -> Iterator[None]:
    """While a ``--json`` command runs: stdout carries nothing but its JSON. Whatever else writes to
    ``sys.stdout`` (the screen's lines, a tracker's library such as MLflow's "View run ... at: URL",
    a stray ``print``) goes to stderr; :func:`print_json` writes to the real stdout."""
    _JSON_STDOUT.append(sys.stdout)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        _JSON_STDOUT.pop()


def print_json(data) -> None:
    """``data`` as indented JSON (``default=str``) on the command's stdout, the real one under
    :func:`json_stdout`; flushed."""
    out = _JSON_STDOUT[-1] if _JSON_STDOUT else sys.stdout
    out.write(json.dumps(data, indent=2, default=str) + "\n")
    out.flush()


#: user text longer than this is cut by :func:`user_text` (and its Markdown/HTML companions): a
#: paragraph, e.g. an example's text or a recorded error
USER_TEXT_LIMIT = 2000
#: the same for ``one_line`` text (a label, a run's reason in a table cell, a name in a line)
USER_LINE_LIMIT = 200


def _limit(limit, one_line: bool) -> int | None:
    return (USER_LINE_LIMIT if one_line else USER_TEXT_LIMIT) if limit is ... else limit


# C0 and C1 control characters and DEL (ESC starts ANSI/OSC sequences, CR rewrites the line),
# the line and paragraph separators, and the bidirectional overrides and isolates that reorder
# what a terminal or a browser shows (U+202A-U+202E, U+2066-U+2069, U+200E/U+200F)
_INVISIBLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\u200e\u200f]")


_NAMED_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _visible_char(m: re.Match) -> str:
    c = m.group(0)
    if c in _NAMED_ESCAPES:
        return _NAMED_ESCAPES[c]
    return f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"


def visible_text(value, *, one_line: bool = False, limit=...) -> str:
    """``value`` as plain text that shows itself: each control character as a visible escape
    (ESC is written ``\\x1b``, U+202E ``\\u202e``), so that nothing it holds moves the cursor, clears
    the screen, links, or reorders what follows; newlines kept (tabs too) unless ``one_line``, where
    they read ``\\n`` (``\\t``); cut after ``limit`` characters of ``value`` (default
    :data:`USER_TEXT_LIMIT`, :data:`USER_LINE_LIMIT` with ``one_line``; ``None``: never) with
    ``... (N more characters)``. Not markup-escaped: for Rich use :func:`user_text`."""
    text, limit = "" if value is None else str(value), _limit(limit, one_line)
    more = len(text) - limit if limit is not None and len(text) > limit else 0
    if more:
        text = text[:limit]
    keep = "" if one_line else "\n\t"
    text = _INVISIBLE.sub(lambda m: m.group(0) if m.group(0) in keep else _visible_char(m), text)
    return text + (f"... ({more} more characters)" if more else "")


def user_text(value, *, one_line: bool = False, limit=...) -> str:
    """User-supplied text (labels, example texts, run names, reasons, recorded error messages) made
    safe to put in Rich markup: a ``console.print`` string, a table cell, a title.

    :func:`visible_text` (control characters as visible escapes, newlines ``\\n`` when
    ``one_line``, cut after ``limit`` characters with ``... (N more characters)``), then Rich's
    markup escaped, so ``[red]x[/]`` and ``[/__w/a.cc:537]`` print as written. ``None`` is ``""``.
    Every screen of tuneproof prints user text through this function (docs/ARCHITECTURE.md).
    """
    text = visible_text(value, one_line=one_line, limit=limit)
    body = text.rstrip("\\")
    if len(body) == len(text):
        return _escape_markup(text)
    # backslashes before a tag escape it: the trailing ones are doubled (Rich prints one of each
    # pair) and closed by an empty span, so they print as written whether a tag follows or not
    return _escape_markup(body) + "\\" * (2 * (len(text) - len(body))) + "[dim][/dim]"


# what Markdown (CommonMark, GitHub) reads as syntax anywhere in a line: escapes, code, emphasis,
# strike-through, table cells, HTML; "]" where it closes a link, an image or a reference definition
# ("](", "][", "]:"; a lone "[x]" stays as written), "_" only where it can open or close emphasis
# (not inside a word such as card_arrival), "&" only where it would start an entity
_MARKDOWN_INLINE = re.compile(r"[\\`*|~<]|\](?=[(\[:])|(?<![0-9A-Za-z])_|_(?![0-9A-Za-z])|&(?=#?[0-9A-Za-z]+;)")
# what it reads as syntax at the start of a line: a heading, a list item, a quote, a rule or a
# setext underline ("-0.5" or "5.000" is no list)
_MARKDOWN_LINE_START = re.compile(
    r"^([ \t]*)(#{1,6}(?=\s|$)|[-+](?=\s|$)|\d{1,9}(?=[.)](?:\s|$))|>|[-=](?=[-=\s]*$))", re.MULTILINE
)


def markdown_text(value, *, one_line: bool = True, limit=..., code_spans: bool = False) -> str:
    """User text for a Markdown file (the dossier, the model card), outside code spans:
    :func:`visible_text`, then the characters Markdown would read as syntax backslash-escaped
    (``|`` stays inside its table cell; ``<``, ``[..](..)``, ``*`` and a leading ``#``, ``-`` or ``>``
    start no HTML, link, emphasis, heading, list or quote; ``&`` before an entity is ``&amp;``). One line by
    default (a table cell, a list item: newlines read ``\\n``); with ``one_line=False`` each newline
    is a hard line break. ``code_spans``: backticks are left as they are, for text whose own words
    mark commands as code (the dossier's); a code span shows its content literally."""
    text = visible_text(value, one_line=one_line, limit=limit)

    def neutral(m: re.Match) -> str:
        c = m.group(0)
        return "&amp;" if c == "&" else c if c == "`" and code_spans else "\\" + c

    text = _MARKDOWN_INLINE.sub(neutral, text)
    text = _MARKDOWN_LINE_START.sub(
        lambda m: m.group(1) + ("\\" + m.group(2) if not m.group(2)[0].isdigit() else m.group(2) + "\\"), text
    )
    return text if one_line else text.replace("\n", "  \n")


#: a Markdown code span (CommonMark: a run of N backticks, its content, the same run of N)
_CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.DOTALL)


def html_text(value, *, one_line: bool = False, limit=..., code_spans: bool = False) -> str:
    """User text for an HTML page: :func:`visible_text`, then ``html.escape`` (quotes included).
    ``code_spans``: text whose own words mark commands as code (the dossier's, as
    :func:`markdown_text` keeps them): each code span becomes ``<code>`` with its content (one
    space of padding on both sides stripped, as CommonMark does); an unpaired backtick stays."""
    text = html.escape(visible_text(value, one_line=one_line, limit=limit), quote=True)
    if not code_spans:
        return text

    def code(m: re.Match) -> str:
        inner = m.group(2)
        if len(inner) > 2 and inner.startswith(" ") and inner.endswith(" ") and inner.strip():
            inner = inner[1:-1]
        return f"<code>{inner}</code>"

    return _CODE_SPAN.sub(code, text)


#: seconds between two plain progress lines when stdout is not a terminal ($TUNEPROOF_PROGRESS_EVERY)
PROGRESS_EVERY_S = 30.0


class LineProgress:
    """Progress as plain lines for logs, CI and ``nohup`` (no terminal to redraw a bar in).

    One line when ``every_s`` seconds have passed since the last line, at each further 10 % of
    ``total``, and at the end: ``train: 40/400 (10%) loss 1.234 | 2.1 it/s | elapsed 0:00:19 | ETA 0:02:51``.
    ``start``: items already done before this process (a resumed run's steps): counted in the
    position, not in the rate or the ETA.
    """

    def __init__(
        self,
        description: str,
        total: int,
        *,
        every_s: float | None = None,
        out=None,
        clock=time.monotonic,
        start: int = 0,
    ):
        self.description, self.total = visible_text(description, one_line=True), max(int(total), 0)
        self.done = self.first = max(int(start), 0)
        self.every_s = (
            float(os.environ.get("TUNEPROOF_PROGRESS_EVERY", PROGRESS_EVERY_S)) if every_s is None else every_s
        )
        self.out = out or (lambda line: console.print(line, markup=False, highlight=False, soft_wrap=True))
        self.clock = clock
        self.start = self.last = clock()
        self.next_decile = 10 * self.done // self.total + 1 if self.total else 1

    @staticmethod
    def _hms(seconds: float) -> str:
        seconds = int(round(seconds))
        return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"

    def line(self, info: str = "") -> str:
        elapsed = self.clock() - self.start
        rate = (self.done - self.first) / elapsed if elapsed > 0 else 0.0
        pct = f" ({100 * self.done // self.total}%)" if self.total else ""
        eta = self._hms((self.total - self.done) / rate) if rate > 0 and self.total else "?"
        return (
            f"{self.description}: {self.done}/{self.total}{pct}"
            + (f" {info}" if info else "")
            + f" | {rate:.2f} it/s | elapsed {self._hms(elapsed)} | ETA {eta}"
        )

    def advance(self, n: int = 1, info: str = "") -> None:
        self.done += n
        self.info = info
        now = self.clock()
        decile = 10 * self.done // self.total if self.total else 0
        if self.done >= self.total or now - self.last >= self.every_s or decile >= self.next_decile:
            self._say(self.line(info))
            self.next_decile = decile + 1

    def beat(self) -> bool:
        """The line again when ``every_s`` seconds passed without one (a batch that takes minutes);
        called by :func:`progress_bar`'s thread (quiet while a heartbeat around it just spoke). True
        when it printed."""
        last = max(self.last, _LAST_LINE[0]) if self.clock is time.monotonic else self.last
        if self.clock() - last < self.every_s:
            return False
        self._say(self.line(getattr(self, "info", "")))
        return True

    def _say(self, line: str) -> None:
        self.out(line)
        self.last = self.clock()
        _said()


@contextlib.contextmanager
def progress_bar(description: str, total: int, *, start: int = 0) -> Iterator:
    """A Rich progress bar on a terminal, else :class:`LineProgress` lines; yields ``advance(n=1, info="")``.
    ``start``: items done before this process (a resumed run's steps), shown in the position but
    not counted in the rate or the time remaining."""
    if not console.is_terminal:
        lines = LineProgress(description, total, start=start)
        _BARS[0] += 1
        try:
            with _beating(lines):
                yield lines.advance
        finally:
            _BARS[0] -= 1
        return
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    ) as prog:
        # user_text: the column reads markup; completed= sets the position without a speed sample (an
        # advance would count the resumed steps as done in no time)
        task = prog.add_task(user_text(description, one_line=True), total=total, info="", completed=start)

        def advance(n: int = 1, info: str = "") -> None:
            prog.update(task, advance=n, info=info)

        yield advance


class Heartbeat:
    """What a phase without a progress bar is doing, said every ``every_s`` seconds off a terminal.

    ``update("verifying the bundle in a fresh process")`` changes what the next line says;
    ``update(done=3, total=12)`` adds ``3/12``; a line reads
    ``export: verifying the bundle in a fresh process (3/12) | elapsed 0:01:30``. Nothing is printed
    on a terminal (its bars and spinners show the phase) or while the phase prints lines itself
    (:meth:`touch` after each one restarts the wait).
    """

    def __init__(
        self, description: str, text: str = "", *, every_s: float | None = None, out=None, clock=time.monotonic
    ):
        self.description, self.text = description, text
        self.done: int | None = None
        self.total: int | None = None
        self.every_s = (
            float(os.environ.get("TUNEPROOF_PROGRESS_EVERY", PROGRESS_EVERY_S)) if every_s is None else every_s
        )
        self.out = out or (lambda line: console.print(line, markup=False, highlight=False, soft_wrap=True))
        self.clock = clock
        self.start = self.last = clock()

    def update(self, text: str | None = None, *, done: int | None = None, total: int | None = None) -> None:
        """What the phase does now (and how far it is, where known)."""
        if text is not None:
            self.text = text
        if done is not None:
            self.done = done
        if total is not None:
            self.total = total

    def touch(self) -> None:
        """The phase printed a line of its own: the next heartbeat waits ``every_s`` from now."""
        self.last = self.clock()

    def line(self) -> str:
        count = f" ({self.done}/{self.total})" if self.done is not None and self.total else ""
        what = f": {self.text}" if self.text else ""
        return f"{self.description}{what}{count} | elapsed {LineProgress._hms(self.clock() - self.start)}"

    def beat(self) -> bool:
        """Print a line when ``every_s`` seconds passed since the last one (this phase's, or a
        progress line of a bar inside it); True when it printed."""
        if self.clock is time.monotonic and _BARS[0]:  # a progress bar inside the phase speaks for it
            return False
        last = max(self.last, _LAST_LINE[0]) if self.clock is time.monotonic else self.last
        if self.clock() - last < self.every_s:
            return False
        self.out(self.line())
        self.last = self.clock()
        _said()
        return True


@contextlib.contextmanager
def heartbeat(description: str, text: str = "", *, every_s: float | None = None) -> Iterator[Heartbeat]:
    """A :class:`Heartbeat` for the ``with`` block: off a terminal a thread prints its line every
    ``every_s`` seconds (default 30, ``$TUNEPROOF_PROGRESS_EVERY``) until the block ends, so a log
    never goes silent for longer (a baseline loading its model, an export verifying its bundle)."""
    beat = Heartbeat(description, text, every_s=every_s)
    if console.is_terminal:
        yield beat
        return
    with _beating(beat):
        yield beat


#: when the last plain progress or heartbeat line was printed (time.monotonic), so that a phase's
#: heartbeat keeps quiet while a progress bar inside it prints
_LAST_LINE = [time.monotonic()]
#: progress bars printing plain lines now (a heartbeat around one keeps quiet)
_BARS = [0]


def _said() -> None:
    _LAST_LINE[0] = time.monotonic()


@contextlib.contextmanager
def _beating(obj) -> Iterator[None]:
    """A daemon thread calling ``obj.beat()`` about once a second until the block ends."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(max(0.01, min(1.0, obj.every_s / 4))):
            obj.beat()

    thread = threading.Thread(target=loop, name="tuneproof heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


#: a column is never narrower than its longest word up to this many characters, so words such as
#: "completed" or "data-check" are not broken at 80 columns; longer tokens (hashes, paths) fold,
#: except in the columns that identify a row (``keep`` of :func:`table`), which are never cut
MAX_UNBROKEN_WORD = 14


def _plain_lines(text: str) -> list[str]:
    if "[" in text:
        try:
            text = Text.from_markup(text).plain
        except MarkupError:
            pass
    return text.splitlines() or [""]


def _longest_word(texts, cap: int | None = MAX_UNBROKEN_WORD) -> int:
    longest = 0
    for text in texts:
        for line in _plain_lines(text):
            for word in line.split():
                longest = max(longest, cell_len(word))
    return longest if cap is None else min(longest, cap)


def _longest_line(texts) -> int:
    return max((cell_len(line) for text in texts for line in _plain_lines(text)), default=0)


def _fill(mins: list[int], maxs: list[int], budget: int) -> list[int]:
    """Column widths between ``mins`` and ``maxs`` summing to at most ``budget`` (``sum(mins) <=
    budget``): the widest wants are cut first (Rich's own rule, which also ignores the minimums)."""
    lo, hi = 0, max(maxs, default=0)
    while lo < hi:  # the largest level L with sum(clamp(L, min, max)) <= budget
        mid = (lo + hi + 1) // 2
        if sum(min(mx, max(mn, mid)) for mn, mx in zip(mins, maxs)) <= budget:
            lo = mid
        else:
            hi = mid - 1
    widths = [min(mx, max(mn, lo)) for mn, mx in zip(mins, maxs)]
    spare = budget - sum(widths)
    for i in range(len(widths)):  # what the level leaves, one character each to the columns still short
        if spare <= 0:
            break
        if widths[i] < maxs[i]:
            widths[i] += 1
            spare -= 1
    return widths


def table(
    title: str,
    columns: list[str],
    rows: list[list],
    *,
    keep: tuple[str, ...] | list[str] | None = None,
    drop: tuple[str, ...] | list[str] = (),
    more: str | None = None,
    width: int | None = None,
) -> Table:
    """A Rich table that fits ``width`` (default the console's: 80 columns when stdout is not a
    terminal and ``$COLUMNS`` is unset) without cutting the cells that identify a row.

    A cell of up to 14 characters is not wrapped; longer cells wrap between words; a word up to 14
    characters is never cut, and no word of a ``keep``
    column (default: the first column; e.g. run ids, variant overrides, metric and class names) is
    cut whatever its length. When that cannot fit with the usual borders, the table is drawn with
    blank column separators; when it still cannot fit, the ``drop`` columns are left out in that
    order (least important first) and a caption names them (plus ``more``, e.g. where to see them).
    Only then are other cells cut (folded), at 6 characters or more; and the kept ones only when they
    alone leave no such room.
    """

    cells = [["" if v is None else str(v) for v in r] for r in rows]
    keep = [columns[0]] if keep is None and columns else list(keep or [])
    width = console.width if width is None else width
    cols = list(range(len(columns)))

    def texts(i: int) -> list[str]:
        return [columns[i]] + [r[i] for r in cells if i < len(r)]

    # a cell of up to 14 characters is not wrapped (a date, a short status), a longer one wraps between
    # its words, a word up to 14 characters is never cut (any length in a kept column)
    mins = {
        i: max(
            _longest_word(texts(i), None if columns[i] in keep else MAX_UNBROKEN_WORD),
            min(_longest_line(texts(i)), MAX_UNBROKEN_WORD),
        )
        for i in cols
    }
    maxs = {i: max(_longest_line(texts(i)), mins[i], 1) for i in cols}

    def overhead(
        n: int, compact: bool
    ) -> int:  # borders and padding (Rich: HEAVY_HEAD, padding 1 | SIMPLE_HEAD, no edge)
        return 2 * n - 2 if compact else 3 * n + 1

    compact, dropped = False, []
    if sum(maxs.values()) + overhead(len(cols), False) > width:
        compact = sum(mins.values()) + overhead(len(cols), False) > width
        for name in drop:
            if sum(mins[i] for i in cols) + overhead(len(cols), True) <= width:
                break
            if name in columns and columns.index(name) in cols:
                cols.remove(columns.index(name))
                dropped.append(name)
    plan = None
    need = sum(mins[i] for i in cols) + overhead(len(cols), compact)
    if sum(maxs[i] for i in cols) + overhead(len(cols), compact) > width:
        budget = width - overhead(len(cols), compact)
        if need <= width:
            plan = dict(zip(cols, _fill([mins[i] for i in cols], [maxs[i] for i in cols], budget)))
        else:  # last resort: the kept columns whole and the others (cut) at 6 characters or more; else all cut
            kept = [i for i in cols if columns[i] in keep]
            rest = [i for i in cols if i not in kept]
            floors = [min(maxs[i], 6) for i in rest]
            left = budget - sum(mins[i] for i in kept)
            if left >= sum(floors):
                plan = {**{i: mins[i] for i in kept}, **dict(zip(rest, _fill(floors, [maxs[i] for i in rest], left)))}
            else:
                plan = dict(zip(cols, _fill([min(maxs[i], 4) for i in cols], [maxs[i] for i in cols], budget)))
    caption = None
    if dropped:
        caption = f"not shown at {width} columns: {', '.join(dropped)}" + (f" ({more})" if more else "")
    kw = dict(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 0, 0, 1)) if compact else {}
    t = Table(title=title, title_justify="left", caption=caption, caption_justify="left", **kw)
    for i in cols:
        if plan is not None:
            t.add_column(columns[i], overflow="fold", width=plan[i])
        else:
            t.add_column(columns[i], overflow="fold", min_width=mins[i])
    for r in cells:
        t.add_row(*[r[i] if i < len(r) else "" for i in cols])
    return t


#: how many items a list names on a screen or in the dossier before "and N more" (the whole list
#: stays in the run's JSON and in the dossier's details)
LIST_CAP = 10


def capped_items(items, *, cap: int = LIST_CAP, where: str | None = None) -> list[str]:
    """The first ``cap`` of ``items`` as strings, then one ``"and N more"`` entry (``"and N more
    (in compare.json)"`` with ``where``) when there are more; ``items`` unchanged when they fit.

    Every list on a screen or in the dossier goes through this (or :func:`capped`), so a study with
    77 classes prints 10 names, not 77.
    """
    items = [str(x) for x in items]
    if len(items) <= cap:
        return items
    return items[:cap] + [f"and {len(items) - cap} more" + (f" (in {where})" if where else "")]


def capped(items, *, cap: int = LIST_CAP, sep: str = ", ", where: str | None = None) -> str:
    """``items`` joined by ``sep``, at most ``cap`` of them, then ``and N more``:
    ``capped(["a", "b", "c"], cap=2) == "a, b and 1 more"``; see :func:`capped_items`."""
    shown = capped_items(items, cap=cap, where=where)
    if len(shown) > cap:
        return sep.join(shown[:-1]) + " " + shown[-1]
    return sep.join(shown)


def fmt(x, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)
