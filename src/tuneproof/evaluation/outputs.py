"""Per-example outputs (``runs/<id>/outputs.jsonl``) bound to the run that wrote them (issue 11).

When an evaluation-like run (baseline, eval, test) writes its outputs, their sha256 is recorded
in the run's summary (the registry row and ``summary.json``: ``outputs_sha256``). Every later
reader that turns them into a verdict or a claim (``compare``, ``show``, ``report``, ``export``)
reads them through :func:`read_outputs`, which refuses a file whose bytes changed since, naming
the file and both hashes. A run recorded before this check existed has no hash and is read as is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tuneproof.errors import TuneproofError
from tuneproof.io import read_jsonl, sha256_file

OUTPUTS = "outputs.jsonl"


def record_outputs_hash(run) -> str:
    """sha256 of ``run``'s ``outputs.jsonl``, stored in its summary as ``outputs_sha256``. Returns it."""
    digest = sha256_file(run.path(OUTPUTS))
    run.update_summary(outputs_sha256=digest)
    return digest


def check_outputs(path: Path, rec) -> str | None:
    """Compare ``path`` (the outputs of run record ``rec``) with the sha256 recorded in its summary.

    Returns the recorded hash (None for a run recorded without one).

    Raises:
        TuneproofError: the file's sha256 differs (names the file, the run and both hashes).
    """
    want = (rec.summary or {}).get("outputs_sha256")
    if want is None:
        return None
    found = sha256_file(path)
    if found != want:
        raise TuneproofError(
            f"{path}: sha256 {found} differs from {want} recorded when run {rec.id} wrote it",
            hint=f"the per-example outputs were edited after the run; restore them, or mark the run invalid "
            f"(`tuneproof invalidate {rec.id} --why ...`) and evaluate again: a verdict is computed only from "
            "the outputs a run recorded",
        )
    return want


def read_outputs(path: Path, rec) -> list[dict[str, Any]]:
    """The rows of ``path`` after :func:`check_outputs`.

    Raises:
        TuneproofError: changed file (see :func:`check_outputs`), or a broken JSON line.
    """
    check_outputs(path, rec)
    return read_jsonl(path)


def check_all(registry) -> int:
    """Check the outputs of every run of ``registry`` that recorded a hash, invalid runs excepted
    (no verdict uses them, and the dossier lists them with their reason); returns how many.

    Raises:
        TuneproofError: the first changed file (see :func:`check_outputs`).
    """
    n = 0
    for rec in registry.list():
        if rec.status == "invalid":
            continue
        path = registry.runs_dir / rec.id / OUTPUTS
        if path.exists() and check_outputs(path, rec) is not None:
            n += 1
    return n
