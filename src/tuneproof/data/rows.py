"""The refused rows of one data file, collected so that one error names them all (the readers of
:mod:`tuneproof.data.sources`, :mod:`tuneproof.data.image_sources` and :mod:`tuneproof.data.images`
share it)."""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

from tuneproof.errors import TuneproofError
from tuneproof.io import atomic_write_text

#: refused rows of one file named in its error, each with its ``file:line`` and reason; past this many the error
#: names the first ones and a file that lists them all ("and N more, all listed in ...")
LISTED_ROWS = 20
#: rows named when every refused row has the same reason (a missing column, a wrong key): the reason once, these
#: first places, and the file with all of them
SAME_REASON_ROWS = 5


def refused_list_path(path: Path | str) -> Path:
    """Where the full list of a file's refused rows is written when there are more than :data:`LISTED_ROWS`: a
    file in the system's temp folder named after the data file (never beside the user's data)."""
    digest = hashlib.sha256(str(path).encode("utf-8")).hexdigest()[:8]
    return Path(tempfile.gettempdir()) / "tuneproof-refused" / f"{Path(str(path)).name}-{digest}.txt"


def write_full_list(path: Path | str, lines: list[str]) -> str:
    """Write ``lines`` (one refused row or example a line) to :func:`refused_list_path` of ``path`` and return
    the words that end a capped list: ``"all M listed in FILE"``, or why the list could not be written."""
    try:
        return f"all {len(lines)} listed in {atomic_write_text(refused_list_path(path), chr(10).join(lines) + chr(10))}"
    except OSError as err:  # the error still names the first ones and says why the rest are not listed
        return f"the full list could not be written: {err.strerror}"


def capped(places: list[str], name: str) -> str:
    """``places`` joined with ", ", all of them up to :data:`LISTED_ROWS`; past that the first ones and
    ``" and N more, all M listed in FILE"`` (:func:`write_full_list`, the file named after ``name``)."""
    if len(places) <= LISTED_ROWS:
        return ", ".join(places)
    more = len(places) - LISTED_ROWS
    return ", ".join(places[:LISTED_ROWS]) + f" and {more} more, {write_full_list(name, places)}"


class BadRows:
    """The refused rows of one file, so that one error names them all instead of the first only
    (a user fixes them in one pass, not one rerun per row).

    :meth:`add` takes each row's :class:`TuneproofError` (its message starts with the row's
    ``file:line``); :meth:`check` raises nothing when no row was refused, the row's own error when
    one was, else one error: ``data/train.csv: 7 rows refused: data/train.csv:3, data/train.csv:5:
    empty label in column 'label' (a missing value, not a class); data/train.csv:8: ...`` (rows in file
    order, consecutive rows with the same reason sharing it; the hints of the rows shown, each once). Past
    :data:`LISTED_ROWS` rows the error names the first ones and ends ``; and N more, all M listed in FILE``:
    every refused row with its reason, one a line, written to :func:`refused_list_path`. When every refused
    row of more than :data:`LISTED_ROWS` has the same reason (a column missing from the whole file), the
    error says it once, first, with the first :data:`SAME_REASON_ROWS` places: ``data/train.csv: all 2,100
    rows refused have the same fault: no column 'label' (data/train.csv:2, ... and 2,095 more, all 2100
    listed in FILE)``.
    """

    def __init__(self, path: Path | str):
        self.path = path
        self.count = 0
        self.first: list[tuple[str, str, str | None]] = []  # (where, reason, hint)
        self.rest: list[str] = []  # "where: reason" of the rows past LISTED_ROWS, for the full list
        self.reasons: set[str] = set()

    def add(self, where: str, err: TuneproofError) -> None:
        self.count += 1
        reason = err.message[len(where) + 2 :] if err.message.startswith(f"{where}: ") else err.message
        self.reasons.add(reason)
        if len(self.first) < LISTED_ROWS:
            self.first.append((where, reason, err.hint))
        else:
            self.rest.append(f"{where}: {reason}")

    def check(self) -> None:
        """Raise for the rows refused (see the class docstring).

        Raises:
            TuneproofError: at least one row was refused.
        """
        if not self.count:
            return
        if self.count == 1:
            where, reason, hint = self.first[0]
            raise TuneproofError(f"{where}: {reason}", hint=hint)
        hints = list(dict.fromkeys(h for _, _, h in self.first if h))
        if len(self.reasons) == 1 and self.count > LISTED_ROWS:
            (reason,) = self.reasons
            places = [w for w, _, _ in self.first] + [line[: -len(reason) - 2] for line in self.rest]
            shown = ", ".join(places[:SAME_REASON_ROWS])
            lines = [f"{w}: {reason}" for w in places]
            raise TuneproofError(
                f"{self.path}: all {self.count:,} rows refused have the same fault: {reason} ({shown} and "
                f"{self.count - SAME_REASON_ROWS:,} more, {write_full_list(self.path, lines)})",
                hint="; ".join(hints) or None,
            )
        groups: list[tuple[list[str], str]] = []
        for where, reason, _ in self.first:
            if groups and groups[-1][1] == reason:
                groups[-1][0].append(where)
            else:
                groups.append(([where], reason))
        more = ""
        if self.rest:
            lines = [f"{w}: {r}" for w, r, _ in self.first] + self.rest
            more = f"; and {len(self.rest)} more, {write_full_list(self.path, lines)}"
        raise TuneproofError(
            f"{self.path}: {self.count} rows refused: " + "; ".join(f"{', '.join(w)}: {r}" for w, r in groups) + more,
            hint="; ".join(hints) or None,
        )
