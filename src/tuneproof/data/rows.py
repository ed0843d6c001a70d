"""The refused rows of one data file, collected so that one error names them all (the readers of
:mod:`tuneproof.data.sources`, :mod:`tuneproof.data.image_sources` and :mod:`tuneproof.data.images`
share it)."""

from __future__ import annotations

from pathlib import Path

from tuneproof.errors import TuneproofError

#: refused rows of one file named in its error: the count, the first ones with ``file:line``, "and N more"
LISTED_ROWS = 5


class BadRows:
    """The refused rows of one file, so that one error names them all instead of the first only
    (a user fixes them in one pass, not one rerun per row).

    :meth:`add` takes each row's :class:`TuneproofError` (its message starts with the row's
    ``file:line``); :meth:`check` raises nothing when no row was refused, the row's own error when
    one was, else one error: ``data/train.csv: 7 rows refused: data/train.csv:3, data/train.csv:5:
    empty label in column 'label' (a missing value, not a class); data/train.csv:8: ...; and 2 more``
    (rows in file order, up to :data:`LISTED_ROWS`, consecutive rows with the same reason sharing it;
    the hints of the rows shown, each once).
    """

    def __init__(self, path: Path | str):
        self.path = path
        self.count = 0
        self.first: list[tuple[str, str, str | None]] = []  # (where, reason, hint)

    def add(self, where: str, err: TuneproofError) -> None:
        self.count += 1
        if len(self.first) < LISTED_ROWS:
            reason = err.message[len(where) + 2 :] if err.message.startswith(f"{where}: ") else err.message
            self.first.append((where, reason, err.hint))

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
        groups: list[tuple[list[str], str]] = []
        for where, reason, _ in self.first:
            if groups and groups[-1][1] == reason:
                groups[-1][0].append(where)
            else:
                groups.append(([where], reason))
        more = self.count - len(self.first)
        hints = list(dict.fromkeys(h for _, _, h in self.first if h))
        raise TuneproofError(
            f"{self.path}: {self.count} rows refused: "
            + "; ".join(f"{', '.join(w)}: {r}" for w, r in groups)
            + (f"; and {more} more" if more else ""),
            hint="; ".join(hints) or None,
        )
