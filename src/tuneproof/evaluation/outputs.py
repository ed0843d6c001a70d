"""Per-example outputs (``runs/<id>/outputs.jsonl``) bound to the run that wrote them
(tests/deliver/test_deliver_claims.py).

When an evaluation-like run (baseline, eval, test) writes its outputs, their sha256 is recorded
in the run's summary (the registry row and ``summary.json``: ``outputs_sha256``). Every later
reader that turns them into a verdict or a claim (``compare``, ``show``, ``report``, ``export``)
reads them through :func:`read_outputs`, which refuses a file whose bytes changed since, naming
the file and both hashes. A run recorded before this check existed has no hash and is read as is.

While an evaluation predicts, :class:`EvalProgress` keeps ``runs/<id>/eval_progress.json``
(``{"done", "n"}``) up to date, so a run killed mid-way says where it stopped; :func:`check_complete`
refuses to judge a run that did not complete (``compare``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tuneproof.errors import CheckFailed, TuneproofError
from tuneproof.evaluation.noise import NOISE_JSON, read_noise
from tuneproof.io import read_json, read_jsonl, sha256_file, write_json

OUTPUTS = "outputs.jsonl"
PROGRESS = "eval_progress.json"
#: seconds between two writes of ``eval_progress.json`` (the first and the last are always written)
PROGRESS_EVERY_S = 1.0


class EvalProgress:
    """``progress(n)`` after each batch of predictions: ``eval_progress.json`` in ``run_dir`` holds
    ``{"done": examples predicted, "n": examples to predict}`` (with ``eval.repeat`` > 1 also ``"repeat"``, 1-based,
    and ``"repeats"``), written atomically at start, at most every :data:`PROGRESS_EVERY_S` seconds, and by
    :meth:`flush` (call it in a ``finally``)."""

    def __init__(self, run_dir: Path, n: int, *, repeat: int = 1, repeats: int = 1):
        self.path, self.n, self.done, self._last = Path(run_dir) / PROGRESS, n, 0, 0.0
        self.repeat = {"repeat": repeat, "repeats": repeats} if repeats > 1 else {}
        self.flush()

    def __call__(self, k: int = 1, *_: Any) -> None:
        self.done += k
        if time.monotonic() - self._last >= PROGRESS_EVERY_S:
            self.flush()

    def flush(self) -> None:
        write_json(self.path, {"done": self.done, "n": self.n, **self.repeat})
        self._last = time.monotonic()


def _redo(rec) -> str:
    if rec.kind == "baseline":  # a few-shot control is run again as itself (summary ``few_shot``: K)
        k = (getattr(rec, "summary", None) or {}).get("few_shot")
        return f"`tuneproof baseline --few-shot {k}`" if k else "`tuneproof baseline`"
    if rec.kind == "test":
        return f"`tuneproof test {rec.parent or 'base'}`"
    return f"`tuneproof eval {rec.parent or 'TRAIN_RUN'}`"


def check_complete(registry, rec) -> None:
    """Refuse to judge an evaluation-like run (baseline, eval, test) that did not complete: its status is
    not ``completed``, or its ``eval.json`` or ``outputs.jsonl`` is missing, or the outputs hold fewer
    rows than ``eval.json``'s ``n``, or an output file on ``eval.sets`` it recorded is missing or changed
    (:func:`set_outputs_problem`). The message says where it stopped when ``eval_progress.json``
    recorded it (``r0005 was interrupted at example 8 of 12; evaluate again``).

    Raises:
        CheckFailed: (exit 3) names the run, its status and reason, where it stopped, and the command
            that evaluates again. ``--allow-different-procedure`` does not lift it.
    """
    run_dir = registry.runs_dir / rec.id
    try:
        prog = read_json(run_dir / PROGRESS) if (run_dir / PROGRESS).is_file() else None
    except TuneproofError:
        prog = None
    where = ""
    stopped = rec.status in ("interrupted", "failed", "running")  # where a run invalidated later stopped is moot
    if stopped and isinstance(prog, dict) and isinstance(prog.get("done"), int) and isinstance(prog.get("n"), int):
        where = (
            f" after all {prog['n']} examples, before its outputs were recorded"
            if prog["done"] >= prog["n"]
            else f" at example {prog['done']} of {prog['n']}"
        )
        if isinstance(prog.get("repeat"), int) and isinstance(prog.get("repeats"), int):
            where += f" of repeat {prog['repeat']} of {prog['repeats']} (eval.repeat)"
    hint = f"{_redo(rec)} evaluates again; a verdict is computed only from a completed evaluation"
    if rec.status != "completed":
        verb = {"interrupted": "was interrupted", "failed": "failed", "running": "is still running"}.get(
            rec.status, f"is {rec.status}"
        )
        why = f" ({rec.reason})" if rec.reason else ""
        raise CheckFailed(f"{rec.id} {verb}{where}{why}; evaluate again", hint=hint)
    ev = read_json(run_dir / "eval.json") if (run_dir / "eval.json").is_file() else None
    out = run_dir / OUTPUTS
    if ev is None or not out.is_file():
        missing = ", ".join(n for n, ok in (("eval.json", ev is not None), (OUTPUTS, out.is_file())) if not ok)
        raise CheckFailed(f"{rec.id} is incomplete: {run_dir} has no {missing}; evaluate again", hint=hint)
    rows = sum(1 for line in out.read_text(encoding="utf-8").splitlines() if line.strip())
    if isinstance(ev.get("n"), int) and rows < ev["n"]:
        raise CheckFailed(f"{rec.id} is incomplete: {rows} of {ev['n']} outputs in {out}; evaluate again", hint=hint)
    if isinstance(ev.get("repeats"), int) and ev["repeats"] > 1 and not (run_dir / "noise.json").is_file():
        raise CheckFailed(
            f"{rec.id} is incomplete: {run_dir} has no noise.json of its {ev['repeats']} repeats; evaluate again",
            hint=hint,
        )
    problem = set_outputs_problem(run_dir, rec)
    if problem is not None:
        raise CheckFailed(f"{rec.id} is incomplete: {problem}; evaluate again", hint=hint)


#: the summary key holding ``{set name: sha256}`` of a run's outputs on ``eval.sets``
SET_OUTPUTS_KEY = "set_outputs_sha256"


def set_outputs_path(run_dir: Path, name: str) -> Path:
    """Where a run keeps its outputs on the ``eval.sets`` entry ``name``: ``sets/<name>/outputs.jsonl``."""
    return Path(run_dir) / "sets" / name / OUTPUTS


def set_outputs_problem(run_dir: Path, rec) -> str | None:
    """What is wrong with the outputs on ``eval.sets`` that ``rec`` recorded (its summary's
    ``set_outputs_sha256``): a file that is gone or whose sha256 changed since the run wrote it
    (``sets/general/outputs.jsonl is missing``); None when each is whole (or the run evaluated no set)."""
    for name, want in sorted(((rec.summary or {}).get(SET_OUTPUTS_KEY) or {}).items()):
        path = set_outputs_path(run_dir, name)
        shown = path.relative_to(run_dir).as_posix()
        if not path.is_file():
            return f"{shown} (its outputs on eval.sets '{name}') is missing"
        found = sha256_file(path)
        if found != want:
            return f"{shown} (its outputs on eval.sets '{name}') has sha256 {found[:12]}, not {want[:12]} as recorded"
    return None


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
        TuneproofError: the first changed file (see :func:`check_outputs`), outputs on ``eval.sets`` and a
            ``noise.json`` (:func:`tuneproof.evaluation.noise.read_noise`) included.
    """
    n = 0
    for rec in registry.list():
        if rec.status == "invalid":
            continue
        path = registry.runs_dir / rec.id / OUTPUTS
        if path.exists() and check_outputs(path, rec) is not None:
            n += 1
        if (registry.runs_dir / rec.id / NOISE_JSON).exists():  # a missing one: the dossier's missing evidence
            read_noise(registry.runs_dir / rec.id, rec)  # the noise floor as the run recorded it (eval.repeat)
        for name, want in sorted(((rec.summary or {}).get(SET_OUTPUTS_KEY) or {}).items()):
            spath = set_outputs_path(registry.runs_dir / rec.id, name)  # a missing one: the dossier's INCOMPLETE
            if spath.exists() and (found := sha256_file(spath)) != want:
                raise TuneproofError(
                    f"{spath}: sha256 {found} differs from {want} recorded when run {rec.id} wrote it",
                    hint=f"the outputs on eval.sets '{name}' were edited after the run; restore them, or mark the run "
                    f"invalid (`tuneproof invalidate {rec.id} --why ...`) and evaluate again",
                )
    return n


def also_record(bar, on_progress):
    """A progress callback that advances ``bar`` (``advance(n=1, info="")``) and calls ``on_progress(n)``."""

    def advance(k: int = 1, *args: Any, **kwargs: Any) -> None:
        bar(k, *args, **kwargs)
        on_progress(k)

    return advance
