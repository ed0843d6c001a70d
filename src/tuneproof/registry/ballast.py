"""Faults of the machine: the ballast file freed on a full disk so that the failure can still be recorded,
and the one-line error that names the folder and the cause."""

from __future__ import annotations

import os
from pathlib import Path

from tuneproof.errors import TuneproofError
from tuneproof.io import (
    fault_message,
)

RESERVE_FILE = ".tuneproof.reserve"  # ballast freed on a full disk so that the failure can still be recorded
RESERVE_BYTES = 256 * 1024


def _fault_error(err: BaseException, cause: str, folder: Path, hint: str) -> TuneproofError:
    return TuneproofError(fault_message(err, cause, folder), hint=hint)


class Ballast:
    """The study folder's ballast (:data:`RESERVE_FILE`), a part of :class:`~tuneproof.registry.Registry`."""

    def _make_reserve(self) -> None:
        """Write the ballast file if it is missing (best effort: no space, no ballast)."""
        path = self.study_dir / RESERVE_FILE
        if path.exists():
            return
        try:
            with open(path, "wb") as fh:
                fh.write(b"\0" * RESERVE_BYTES)
                fh.flush()
                os.fsync(fh.fileno())
        except OSError:
            try:
                path.unlink()
            except OSError:
                pass

    def _release_reserve(self) -> None:
        try:
            (self.study_dir / RESERVE_FILE).unlink()
        except OSError:
            pass
