"""Paths a run records, read back in the study folder as it is now (a copied or moved study reads its own
copy, never the original folder's)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from tuneproof.study import STUDY_FILE

STUDY_LAYOUT = ("exports", "runs")
#: summary key of a run that records its paths inside the study relative to it (:func:`study_relative`)
RELATIVE_PATHS = "paths_relative_to_study"


def _inside(path: Path, folder: Path) -> Path | None:
    """``path`` relative to ``folder`` (as written, then both resolved), or None when it lies elsewhere."""
    for p, f in ((path, folder), (path.resolve(), folder.resolve())):
        if p.is_relative_to(f):
            return p.relative_to(f)
    return None


def study_relative(study_dir: str | Path, path: str | Path) -> str:
    """How a run records ``path``: relative to the study folder (POSIX, ``exports/r0003``) when it lies
    inside it, so that a copied or moved study reads its own copy; absolute when it lies elsewhere (an
    export with ``--out /elsewhere``)."""
    p = Path(os.path.abspath(path))
    rel = _inside(p, Path(study_dir))
    return str(p) if rel is None else (rel.as_posix() or ".")


@dataclass(frozen=True)
class RecordedPath:
    """A path a run recorded, read back in the study folder as it is now (:meth:`Registry.recorded_path`).

    ``path``: where the file is in this study folder (or was recorded, outside any study); ``shown``: how
    screens and the dossier name it (relative to the study folder inside it, else absolute); ``moved``:
    the recorded path was absolute under the folder this study was copied or moved from and is read from
    this folder; ``warning``: one line when this folder has no copy of it (never a pointer elsewhere).
    """

    recorded: str
    path: Path
    shown: str
    moved: bool = False
    warning: str | None = None


def read_recorded_path(
    study_dir: str | Path, recorded: str, moved_from: Path | None = None, *, relative_records: bool = False
) -> RecordedPath:
    """Resolve a recorded path against the study folder ``study_dir`` as it is now.

    - relative (this version records paths inside the study so): ``study_dir / recorded``;
    - absolute inside ``study_dir``: unchanged;
    - absolute under another study folder, which this one was copied or moved from (``moved_from``, the
      folder the registry was created in; or, for a study copied before the registry recorded it, the
      nearest folder above the path that holds a study file, or the ``<root>`` of ``<root>/exports/...`` /
      ``<root>/runs/...`` when the recorded path is gone): the same relative path in ``study_dir``, with a
      warning when this folder has no such file (the original folder's file is never used);
    - anything else (an export with ``--out /elsewhere``): unchanged.

    ``relative_records``: the run recorded its paths inside the study relative (:data:`RELATIVE_PATHS` in its
    summary), so an absolute one lies outside by choice: only ``moved_from`` is mapped, never guessed.
    """
    here = Path(study_dir)
    p = Path(recorded)
    if not p.is_absolute():
        return RecordedPath(recorded, here / p, p.as_posix())
    rel = _inside(p, here)
    if rel is not None:
        return RecordedPath(recorded, p, rel.as_posix())
    root = None
    if moved_from is not None and (rel := _inside(p, moved_from)) is not None:
        root = moved_from
    elif not relative_records:
        parts = p.parts
        at = max((i for i, part in enumerate(parts) if part in STUDY_LAYOUT and 0 < i < len(parts) - 1), default=None)
        study = next((a for a in p.parents if (a / STUDY_FILE).is_file()), None)  # another study folder holds it
        if study is not None:
            root, rel = study, p.relative_to(study)
        elif at is not None and not p.exists():
            root, rel = Path(*parts[:at]), Path(*parts[at:])
    if root is None or rel is None:
        return RecordedPath(recorded, p, str(p))
    mine = here / rel
    if mine.exists():
        return RecordedPath(recorded, mine, rel.as_posix(), moved=True)
    where = (
        f"{root}, the folder this study was copied or moved from"
        if root == moved_from or (root / STUDY_FILE).is_file()
        else f"{root}, which is gone (this study was copied or moved from there)"
    )
    return RecordedPath(
        recorded,
        mine,
        rel.as_posix(),
        moved=True,
        warning=f"{recorded} was recorded in {where}; this study folder has no {rel.as_posix()}",
    )


def trained_paths_line(study_dir: str | Path, run_id: str) -> str:
    """Where a train run's outputs are, relative to the study folder (:func:`study_relative`): its adapter (or
    full ``model``), ``checkpoints`` and ``metrics.jsonl``, each named only when it is there, e.g.
    ``r0003: adapter runs/r0003/adapter; checkpoints runs/r0003/checkpoints; metrics runs/r0003/metrics.jsonl``."""
    run_dir = Path(study_dir) / "runs" / run_id
    parts = [
        f"{what} {study_relative(study_dir, run_dir / name)}"
        for what, name in (
            ("adapter", "adapter"),
            ("model", "model"),
            ("checkpoints", "checkpoints"),
            ("metrics", "metrics.jsonl"),
        )
        if (run_dir / name).exists()
    ]
    return f"{run_id}: " + ("; ".join(parts) if parts else f"nothing saved in {study_relative(study_dir, run_dir)}")
