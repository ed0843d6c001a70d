"""The study's extra evaluation sets (``eval.sets``, docs/eval-sets.md): each one read by the readers of
``data.sources`` (:func:`tuneproof.data.sources.load_source`), checked, and identified by the sha256 and size
of its files, which the evaluation fingerprint holds (:mod:`tuneproof.evaluation.fingerprint`).

A set is a file of prompts outside the task (e.g. general instructions in the user's language), with or without
references (``fields.target``). It is never split, cleaned into the task's splits or trained on: baseline, eval and
test generate it after the eval split with the same model, prompt template and decoding
(:mod:`tuneproof.evaluation.eval_sets`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuneproof.data.examples import Example
from tuneproof.data.sources import load_source, source_files
from tuneproof.errors import TuneproofError
from tuneproof.io import sha256_file, sha256_json
from tuneproof.study import AGREEMENT, STUDY_FILE, FieldMap, Source, Study


@dataclass(frozen=True)
class EvalSetData:
    """One ``eval.sets`` entry as read.

    Attributes:
        name: the set's name (``eval.sets[i].name``).
        key: the study key that holds it (``eval.sets[0]``), named in errors.
        examples: its examples in file order (``text``, ``target`` or None, ``id``).
        sha256: hex sha256 of its file's bytes (several files, a ``lines`` folder: sha256 of their sorted
            ``[{"file", "sha256"}]`` list).
        bytes: total size of its files, in bytes.
        has_references: every example has a reference (``fields.target`` set).
    """

    name: str
    key: str
    examples: tuple[Example, ...]
    sha256: str
    bytes: int
    has_references: bool

    def fingerprint_entry(self) -> dict[str, Any]:
        """What the evaluation fingerprint holds of the set: ``{"name", "sha256", "bytes", "n", "references"}``."""
        return {
            "name": self.name,
            "sha256": self.sha256,
            "bytes": self.bytes,
            "n": len(self.examples),
            "references": self.has_references,
        }


def load_eval_sets(study: Study, study_dir: Path, data_root: Path | None = None) -> list[EvalSetData]:
    """Read every ``eval.sets`` entry of ``study`` (paths as ``data.sources`` resolves them: relative to
    ``study_dir``, ``$DATA/...`` from the data root) and check the guards that name them.

    Returns:
        one :class:`EvalSetData` per entry, in the study's order ([] when ``eval.sets`` is empty).

    Raises:
        TuneproofError: (exit 2) names the study file and the key (``eval.sets[i]``) with the reader's own
            message: a missing file, a row without the text column (file:line), a broken line, an empty set, ids
            repeated within the set; or ``hypothesis.guards[i].metric``: a metric that needs references
            (anything but agreement) on a set without ``fields.target``.
    """
    out: list[EvalSetData] = []
    where = Path(study_dir) / STUDY_FILE
    for i, spec in enumerate(study.eval.sets):
        key = f"eval.sets[{i}] ('{spec.name}')"
        src = Source(path=spec.path, format=spec.format)
        fields = FieldMap(text=spec.fields.text, target=spec.fields.target, id=spec.fields.id)
        try:
            files = source_files(src, Path(study_dir), data_root, fields)
            missing = [p for p in files if not p.is_file()]
            if not files or missing:
                shown = missing[0] if missing else src.path
                raise TuneproofError(f"{shown}: file not found")
            examples, _ = load_source(
                src, fields, Path(study_dir), data_root, max_chars=study.data.max_chars, chat=study.data.chat
            )
        except TuneproofError as err:
            raise TuneproofError(
                f"{where}: {key}: {err.message}",
                hint=f"fix {key.split(' ')[0]}.path / .fields in tuneproof.yaml (fields.text names the prompt column)",
            ) from None
        if not examples:
            raise TuneproofError(
                f"{where}: {key}: {files[0]} holds no examples",
                hint=f"an evaluation set needs at least one prompt; fix {key.split(' ')[0]}.path or remove the set",
            )
        seen: dict[str, str] = {}
        for e in examples:
            if e.id in seen:
                raise TuneproofError(
                    f"{where}: {key}: id '{e.id}' at {e.source} repeats {seen[e.id]}",
                    hint=f"ids must be unique within a set: fix {key.split(' ')[0]}.fields.id (or leave it out)",
                )
            seen[e.id] = e.source
        digests = [{"file": p.name, "sha256": sha256_file(p)} for p in files]
        digest = digests[0]["sha256"] if len(digests) == 1 else sha256_json(sorted(digests, key=lambda d: d["file"]))
        out.append(
            EvalSetData(
                name=spec.name,
                key=key,
                examples=tuple(examples),
                sha256=digest,
                bytes=sum(p.stat().st_size for p in files),
                has_references=all(e.target is not None for e in examples),  # format chat: its final assistant turns
            )
        )
    check_set_guards(study, out, where)
    return out


def check_set_guards(study: Study, sets: list[EvalSetData], where: Path | str = STUDY_FILE) -> None:
    """A guard on a set (``hypothesis.guards[i].set``) whose metric needs references (every metric but
    ``agreement``) names a set with references.

    Raises:
        TuneproofError: names ``hypothesis.guards[i].metric`` and the set.
    """
    by_name = {s.name: s for s in sets}
    for i, g in enumerate(study.hypothesis.guards):
        s = by_name.get(g.set or "")
        if s is None or g.metric == AGREEMENT or s.has_references:
            continue
        raise TuneproofError(
            f"{where}: hypothesis.guards[{i}].metric: '{g.metric}' needs references, and eval.sets '{s.name}' has "
            "none (no fields.target)",
            hint=f"judge the set by agreement (metric: agreement, floor: 0.8), or add a reference column to "
            f"{s.key.split(' ')[0]}.fields.target",
        )


def fingerprint_part(sets: list[EvalSetData]) -> list[dict[str, Any]]:
    """The ``eval_sets`` part of the evaluation fingerprint: :meth:`EvalSetData.fingerprint_entry` of each set."""
    return [s.fingerprint_entry() for s in sets]
