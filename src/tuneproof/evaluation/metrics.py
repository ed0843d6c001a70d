"""Task metrics over per-example output records: the entry point ``score(task, records, ...)``.

Every scorer takes the per-example records of ``runs/<id>/outputs.jsonl`` (see
docs/CONTRACTS.md: ``id``, ``category``, ``reference``, ``prediction``) and returns
``(records, metrics)``: copies of the records with ``correct`` and ``scores`` filled in, and
one flat dict of metrics. Inputs are never modified. Every rate is a fraction in [0, 1].

The scorers live with their task kinds in :mod:`tuneproof.tasks` (one module per kind:
classification, multi-label, extraction, format); the names below are re-exported so callers
keep one import path. JSON parsing (strict RFC 8259, docs/CASES.md C16) is
:mod:`tuneproof.tasks.parsing`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from tuneproof.tasks import TASKS as _TASKS
from tuneproof.tasks import TaskConfig, get_task
from tuneproof.tasks.classification import INVALID_LABEL, score_classification
from tuneproof.tasks.extraction import DEFAULT_FIELDS as DEFAULT_EXTRACTION_FIELDS
from tuneproof.tasks.extraction import score_extraction
from tuneproof.tasks.format import FormatRule, score_format
from tuneproof.tasks.multilabel import score_multilabel
from tuneproof.tasks.parsing import parse_json_output

TASKS = tuple(_TASKS)
# Headline metrics per task: the ones the paired comparison always reports with a CI (those present).
HEADLINE_METRICS = {name: list(t.headline) for name, t in _TASKS.items()}

__all__ = [
    "DEFAULT_EXTRACTION_FIELDS",
    "HEADLINE_METRICS",
    "INVALID_LABEL",
    "TASKS",
    "FormatRule",
    "check_targets_json",
    "score",
    "score_classification",
    "score_extraction",
    "score_format",
    "score_multilabel",
]


def score(
    task: str,
    records: Sequence[dict],
    *,
    required_fields: Sequence[str] | None = None,
    eval_cfg: Any = None,
    labels: Sequence[str] | None = None,
) -> tuple[list[dict], dict]:
    """Score records for a task kind (``classification``, ``multi-label``, ``extraction``, ``format``).

    ``eval_cfg`` is the study's :class:`tuneproof.study.Eval` (or a dict of it, or None for
    defaults); it supplies ``allow_fenced_json``, ``json_schema``, ``regex`` and ``grammar``.
    ``labels`` is the label vocabulary of kinds that have one. See the task modules for the
    metric keys.

    Raises:
        TuneproofError: unknown task, or anything the task scorer raises.
    """
    kind = get_task(task)
    return kind.score(records, TaskConfig.make(required_fields, eval_cfg, labels))


# --------------------------------------------------------------------------- data check
def check_targets_json(examples: Iterable[Any], required_fields: Sequence[str] | None = None) -> dict:
    """Strict JSON parse rate of example targets (docs/CASES.md C16), for the data check.

    Args:
        examples: :class:`tuneproof.data.examples.Example` objects whose ``target`` should be
            strict JSON (no code fence allowed: data is not model output).
        required_fields: optional top-level keys each target object must have.

    Returns:
        ``{"check": "targets_strict_json", "n", "n_valid", "parse_rate", "n_missing_fields",
        "passed", "bad": [{"id", "source", "error"}]}``. ``parse_rate`` = strict parses / n in
        [0, 1] (1.0 when n == 0); ``passed`` when no target is bad. A missing target, a parse
        failure, or (counted in ``n_missing_fields``, not in the parse rate) a missing required
        key makes a target bad; ``error`` says which, e.g. ``"python_literal:
        Expecting property name enclosed in double quotes at line 1 column 2 (...)"``.
    """
    required = list(required_fields or [])
    n = n_valid = n_missing = 0
    bad = []
    for ex in examples:
        n += 1
        obj, err = (None, "empty: no target") if ex.target is None else parse_json_output(ex.target, allow_fenced=False)
        if err is None:
            n_valid += 1
            missing = [k for k in required if not isinstance(obj, dict) or k not in obj]
            if missing:
                n_missing += 1
                err = f"missing_fields: required top-level keys missing: {missing}"
        if err is not None:
            bad.append({"id": ex.id, "source": ex.source, "error": err})
    return {
        "check": "targets_strict_json",
        "n": n,
        "n_valid": n_valid,
        "parse_rate": n_valid / n if n else 1.0,
        "n_missing_fields": n_missing,
        "passed": not bad,
        "bad": bad,
    }
