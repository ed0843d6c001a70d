"""Task kinds, one module each, with the same parts in the same places (see :mod:`tuneproof.tasks.task`).

``get_task(name)`` returns the kind; ``task_config(ctx)`` builds the scorer's
:class:`~tuneproof.tasks.task.TaskConfig` from a study context. Adding a kind = one module here,
one entry in :data:`TASKS`, one template, one row of ``tests/tasks/test_task_matrix.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tuneproof.errors import TuneproofError
from tuneproof.study import AGREEMENT, STUDY_FILE, Eval, Study
from tuneproof.tasks.classification import TASK as CLASSIFICATION
from tuneproof.tasks.extraction import TASK as EXTRACTION
from tuneproof.tasks.format import TASK as FORMAT
from tuneproof.tasks.image_classification import TASK as IMAGE_CLASSIFICATION
from tuneproof.tasks.multilabel import TASK as MULTI_LABEL
from tuneproof.tasks.task import ExampleRule, Task, TaskConfig

TASKS: dict[str, Task] = {t.name: t for t in (CLASSIFICATION, MULTI_LABEL, EXTRACTION, FORMAT, IMAGE_CLASSIFICATION)}

__all__ = [
    "TASKS",
    "ExampleRule",
    "Task",
    "TaskConfig",
    "check_hypothesis_metrics",
    "check_set_references",
    "get_task",
    "metric_names",
    "task_config",
]


def get_task(name: str) -> Task:
    """The task kind called ``name``.

    Raises:
        TuneproofError: unknown kind (names ``hypothesis.task`` and the known kinds).
    """
    try:
        return TASKS[name]
    except KeyError:
        raise TuneproofError(
            f"hypothesis.task: unknown task kind '{name}'", hint=f"use one of {', '.join(TASKS)}"
        ) from None


def check_set_references(
    task: str,
    sets: Sequence[Any],
    required_fields: Sequence[str] | None = None,
    eval_cfg: Any = None,
    where: Path | str = STUDY_FILE,
) -> None:
    """Every reference of an ``eval.sets`` entry with references (``fields.target``) is one the task kind's
    scorer accepts, checked before any run: ``compare`` scores a set with references by the study's task kind
    (docs/eval-sets.md), and a reference it refuses (an extraction target that is not strict JSON) would only
    surface there, after baseline and eval had generated the set. Each reference is scored as its own
    prediction with the scorer ``compare`` uses (``required_fields``, ``eval_cfg``; a set's classes are its
    references', as compare adds them).

    Args:
        task: ``hypothesis.task``.
        sets: :class:`tuneproof.data.eval_sets.EvalSetData` entries (``key``, ``name``, ``examples``,
            ``has_references``); a set without references is not read.

    Raises:
        TuneproofError: (exit 2) names the study file, ``eval.sets[i]`` and the scorer's own message (the
            example id), with what to do.
    """
    kind = get_task(task)
    for s in sets:
        if not s.has_references:
            continue
        rows = [{"id": e.id, "reference": e.target, "prediction": e.target} for e in s.examples]
        labels = kind.label_set(s.examples) if kind.has_label_set else None
        try:
            kind.score(rows, TaskConfig.make(required_fields, eval_cfg, labels))
        except TuneproofError as err:
            raise TuneproofError(
                f"{where}: {s.key}: {err.message}",
                hint=f"fix that reference in the set's file (a chat set's is its final assistant turn), or leave "
                f"{s.key.split(' ')[0]}.fields.target out and judge the set by agreement: compare scores a set "
                f"with references as hypothesis.task '{task}' does",
            ) from None


def task_config(ctx: Any, *, required_fields: Any = None, eval_cfg: Any = None, examples: Any = None) -> TaskConfig:
    """The scorer's config of a :class:`~tuneproof.context.StudyContext`: required fields, the eval
    section (the study file's unless given, e.g. the frozen hypothesis's) and the label set of the
    train split (for kinds that have one). ``examples`` (the evaluated ones): their classes that train
    never shows are added to the label set (sorted, after train's), so a class only in the reserved
    test split is scored as what it is, an error on every example of it, instead of refused."""
    kind = get_task(ctx.task)
    labels = (
        kind.label_set(ctx.all_splits["train"]) if kind.has_label_set else None
    )  # other kinds never read the data here
    if labels is not None and examples is not None:
        labels = list(labels) + sorted(set(kind.label_set(examples) or []) - set(labels))
    return TaskConfig.make(
        ctx.study.hypothesis.required_fields if required_fields is None else required_fields,
        ctx.study.eval if eval_cfg is None else eval_cfg,
        labels,
        ctx.study.data.test_split,
    )


def metric_names(
    task: str,
    *,
    required_fields: Sequence[str] | None = None,
    json_schema: Any = None,
    regex: str | None = None,
    grammar: str | None = None,
) -> dict[str, list[str]]:
    """The metric names a comparison can report for ``task`` (what ``hypothesis.success.metric`` and
    ``hypothesis.guards[].metric`` may name); the task kind's ``metric_names`` part.

    A format study reports ``json_valid_rate`` only with a JSON check (``eval.json_schema`` or
    ``hypothesis.required_fields``), ``schema_valid_rate`` only with ``eval.json_schema``,
    ``regex_match_rate`` only with ``eval.regex`` (``part_accuracy`` when it has named groups),
    ``grammar_valid_rate`` / ``function_accuracy`` / ``slot_*`` only with ``eval.grammar``,
    ``required_fields_rate`` only with required fields. Extraction reports ``intent_accuracy``
    when references have an intent, and ``intent_micro_f1`` / ``intent_macro_f1`` /
    ``intent_precision`` / ``intent_recall`` when some reference intent is a list.

    Returns:
        ``{"aggregate": [...], "per_class": ["per_class_recall", ...], "per_field": [...]}``.

    Raises:
        TuneproofError: unknown task kind, or an invalid format rule.
    """
    cfg = TaskConfig.make(required_fields, Eval(json_schema=json_schema, regex=regex, grammar=grammar))
    return get_task(task).metric_names(cfg)


def check_hypothesis_metrics(study: Study, path: str | Path = STUDY_FILE) -> None:
    """Every metric the hypothesis names is one the comparison reports for its task
    (:func:`metric_names`), and ``classes`` / ``correction: holm`` are only set on a per-class guard.

    Raises:
        TuneproofError: names the key (``hypothesis.success.metric``, ``hypothesis.guards[i].metric``
            ``.classes`` or ``.correction``) and lists the metrics of the task.
    """
    h, e = study.hypothesis, study.eval
    names = metric_names(
        h.task, required_fields=h.required_fields, json_schema=e.json_schema, regex=e.regex, grammar=e.grammar
    )
    aggregate = names["aggregate"]
    if h.success.metric not in aggregate:
        raise TuneproofError(
            f"{path}: hypothesis.success.metric: '{h.success.metric}' is not a metric of task '{h.task}'"
            + _why_missing(h.task, h.success.metric),
            hint=f"use one of {', '.join(aggregate)}",
        )
    for i, g in enumerate(h.guards):
        allowed = aggregate + names["per_class"] + names["per_field"]
        if g.set is not None:  # a guard on an eval.sets entry: agreement, or an aggregate metric of the task
            allowed = [AGREEMENT, *aggregate]
        if g.metric not in allowed:
            raise TuneproofError(
                f"{path}: hypothesis.guards[{i}].metric: '{g.metric}' is not a metric of task '{h.task}'"
                + _why_missing(h.task, g.metric),
                hint=f"use one of {', '.join(allowed)}",
            )
        if g.classes is not None and not g.metric.startswith("per_class_"):
            raise TuneproofError(
                f"{path}: hypothesis.guards[{i}].classes: only a per_class_* "
                f"guard names classes (metric is '{g.metric}')",
                hint="remove classes, or use a per_class_* metric",
            )
        if g.correction == "holm" and not g.metric.startswith("per_class_"):
            raise TuneproofError(
                f"{path}: hypothesis.guards[{i}].correction: holm applies to a per_class_* guard "
                f"(one paired test per class); metric is '{g.metric}'",
                hint="remove correction, or use a per_class_* metric",
            )


def _why_missing(task: str, metric: str) -> str:
    needs = {
        "schema_valid_rate": "eval.json_schema",
        "regex_match_rate": "eval.regex",
        "required_fields_rate": "hypothesis.required_fields",
        "json_valid_rate": "eval.json_schema or hypothesis.required_fields",
        "part_accuracy": "eval.regex has named groups",
        **dict.fromkeys(
            ("grammar_valid_rate", "function_accuracy", "slot_precision", "slot_recall", "slot_f1"), "eval.grammar"
        ),
    }
    return (
        f" (a format study reports it only when {needs[metric]} is set)" if task == "format" and metric in needs else ""
    )
