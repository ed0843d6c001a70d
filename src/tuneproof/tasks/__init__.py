"""Task kinds, one module each, with the same parts in the same places (see :mod:`tuneproof.tasks.base`).

``get_task(name)`` returns the kind; ``task_config(ctx)`` builds the scorer's
:class:`~tuneproof.tasks.base.TaskConfig` from a study context. Adding a kind = one module here,
one entry in :data:`TASKS`, one template, one row of ``tests/tasks/test_task_matrix.py``.
"""

from __future__ import annotations

from typing import Any

from tuneproof.errors import TuneproofError
from tuneproof.tasks.base import ExampleRule, Task, TaskConfig
from tuneproof.tasks.classification import TASK as CLASSIFICATION
from tuneproof.tasks.extraction import TASK as EXTRACTION
from tuneproof.tasks.format import TASK as FORMAT
from tuneproof.tasks.image_classification import TASK as IMAGE_CLASSIFICATION
from tuneproof.tasks.multilabel import TASK as MULTI_LABEL

TASKS: dict[str, Task] = {t.name: t for t in (CLASSIFICATION, MULTI_LABEL, EXTRACTION, FORMAT, IMAGE_CLASSIFICATION)}

__all__ = ["TASKS", "ExampleRule", "Task", "TaskConfig", "get_task", "task_config"]


def get_task(name: str) -> Task:
    """The task kind called ``name``.

    Raises:
        TuneproofError: unknown kind (names ``hypothesis.task`` and the known kinds).
    """
    try:
        return TASKS[name]
    except KeyError:
        raise TuneproofError(f"hypothesis.task: unknown task kind '{name}'", hint=f"use one of {', '.join(TASKS)}") from None


def task_config(ctx: Any, *, required_fields: Any = None, eval_cfg: Any = None) -> TaskConfig:
    """The scorer's config of a :class:`~tuneproof.context.StudyContext`: required fields, the eval
    section (the study file's unless given, e.g. the frozen hypothesis's) and the label set of the
    train split (for kinds that have one)."""
    kind = get_task(ctx.task)
    labels = kind.label_set(ctx.all_splits["train"]) if kind.has_label_set else None  # other kinds never read the data here
    return TaskConfig.make(ctx.study.hypothesis.required_fields if required_fields is None else required_fields,
                           ctx.study.eval if eval_cfg is None else eval_cfg, labels)
