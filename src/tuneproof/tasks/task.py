"""The shape every task kind has, and the helpers they share.

PEFT's lesson applied to tasks (STYLE.md): a task kind is one module with the same parts in the
same order, so a reader who knows one knows all, and adding a kind is one module plus one row of
``tests/tasks/test_task_matrix.py``:

1. ``reader``: what the reader expects in ``data.fields`` (label, target) and which model heads fit;
2. ``label_set``: the label vocabulary, from the train split (the pipeline's classes);
3. ``score``: per-example ``correct`` / ``scores`` and one flat dict of metrics;
4. ``bootstrap_stats``: additive per-example statistics whose sums give every metric, so the
   paired bootstrap (:mod:`tuneproof.evaluation.compare`) recomputes them exactly;
5. ``example_rule``: the per-example pass rule behind fixed / broken counts and McNemar's test
   for a success metric (tests/tasks/test_task_rules.py);
6. ``audit``: the data-check audit of the targets / labels;
7. ``template``: the study file template ``tuneproof init --task NAME`` writes.

Rules shared by every kind: a missing or unparseable value is always wrong, never a match
(docs/CASES.md C20); set-valued values are compared as sets; rates are fractions in [0, 1].
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tuneproof.data.audit import audit_labels
from tuneproof.errors import TuneproofError
from tuneproof.study import Eval

Blocks = dict[str, np.ndarray]
# metric_fn(sums, n, undefined): sums = {block: [B, m] sums of per-example statistics over a
# (re)sample}; returns {metric key: [B] values}; ``undefined`` fills 0/0 (0.0 = scikit-learn's
# zero_division=0 for point metrics, NaN in the bootstrap so undefined resamples are skipped).
MetricFn = Callable[[Blocks, int, float], dict]

PASS_F1 = 0.5  # per-example rule for F1-like success metrics: an example passes when its F1 >= 0.5


# --------------------------------------------------------------------------- parts of a task kind
@dataclass(frozen=True)
class TaskConfig:
    """What a scorer needs from the study: ``hypothesis.required_fields``, the ``eval`` section
    (a :class:`tuneproof.study.Eval`; None means defaults) and the label set (None: from the
    references)."""

    required_fields: tuple[str, ...] = ()
    eval: Any = None
    labels: tuple[str, ...] | None = None
    test_split: str = "test"  # ``data.test_split``: the sealed split (a class only there is a warning, not a fault)

    @classmethod
    def make(
        cls,
        required_fields: Sequence[str] | None = None,
        eval_cfg: Any = None,
        labels: Sequence[str] | None = None,
        test_split: str = "test",
    ) -> TaskConfig:
        if eval_cfg is None:
            eval_cfg = Eval()
        elif isinstance(eval_cfg, dict):
            eval_cfg = Eval.model_validate(eval_cfg)
        labels_ = None if labels is None else tuple(str(x) for x in labels)
        return cls(tuple(required_fields or ()), eval_cfg, labels_, test_split)


@dataclass(frozen=True)
class ReaderHints:
    """What a task kind expects from the reader (``data.fields``) and which model heads fit it."""

    label: str
    target: str
    model_kinds: tuple[str, ...]


@dataclass
class BootstrapStats:
    """Per-example statistics of both runs (same keys, same widths) and the metric function."""

    base: Blocks
    cand: Blocks
    metric_fn: MetricFn
    example_class: list[str | None]


@dataclass(frozen=True)
class ExampleRule:
    """Per-example rule for paired counts: ``score(rec)`` in [0, 1]; the example passes when
    ``score >= threshold``. ``name`` is the basis (``"correct"``, ``"field_f1"`` ...),
    ``description`` the sentence shown on the compare screen."""

    name: str
    description: str
    score: Callable[[dict], float]
    threshold: float = 1.0

    def passing(self, rec: dict) -> bool:
        return self.score(rec) >= self.threshold - 1e-12


class Task:
    """Base of the task kinds. Subclasses set the class attributes and implement ``score`` and
    ``bootstrap_stats``; the other parts have defaults that fit most kinds."""

    name: str = ""
    template: str = ""
    reader: ReaderHints = ReaderHints("category", "expected output", ("causal-lm",))
    headline: tuple[str, ...] = ()
    summary: tuple[str, ...] = ()  # scalar metrics kept in the run summary (default: headline)
    per_class_metric: str = "recall"  # metric per category in limits and the dossier
    has_confusion: bool = False
    has_label_set: bool = False  # True when ``label_set`` gives the scorer a vocabulary (read from the train split)

    # 2. labels
    def label_set(self, train_examples: Iterable[Any]) -> list[str] | None:
        """Sorted class names seen in train, or None when the kind has no class vocabulary."""
        return None

    # 3. scorer
    def metric_names(self, cfg: TaskConfig) -> dict[str, list[str]]:
        """``{"aggregate", "per_class", "per_field"}``: the names a comparison can report (what the
        hypothesis may name; per_* as ``per_class_<key>`` / ``per_field_<key>``)."""
        raise NotImplementedError

    def score(self, records: Sequence[dict], cfg: TaskConfig) -> tuple[list[dict], dict]:
        raise NotImplementedError

    # 4. per-example statistics for the bootstrap
    def bootstrap_stats(
        self, base: list[dict], cand: list[dict], base_m: dict, cand_m: dict, cfg: TaskConfig
    ) -> BootstrapStats:
        raise NotImplementedError

    def headline_for(self, metrics: dict) -> list[str]:
        return [k for k in self.headline if k in metrics]

    def summary_for(self, metrics: dict) -> dict[str, float]:
        keys = self.summary or self.headline
        return {
            k: metrics[k]
            for k in keys
            if isinstance(metrics.get(k), (int, float)) and not isinstance(metrics.get(k), bool)
        }

    # 5. per-example rule
    def example_rule(self, metric: str | None) -> ExampleRule:
        return CORRECT_RULE

    def predicted_key(self, rec: dict) -> str | None:
        """The class a record predicts (for the one-class-for-most-examples check), or None."""
        return None

    def reference_key(self, rec: dict) -> str | None:
        return None

    def failure_kind(self, rec: dict) -> str:
        """A short name for why a scored record is wrong (limits, dossier)."""
        sc = rec.get("scores") or {}
        if sc.get("parse_error"):
            return str(sc["parse_error"]).split(":", 1)[0].strip() or "not parseable"
        return "output differs from the reference"

    # 6. data-check audit
    def audit(self, splits: dict[str, list], cfg: TaskConfig) -> dict[str, Any]:
        """``{"labels": ..., "targets": ..., "hard_faults": [...], "warnings": [...]}``."""
        labels = audit_labels(splits, cfg.test_split)
        return {
            "labels": labels,
            "targets": None,
            "hard_faults": list(labels["hard_faults"]),
            "warnings": list(labels["warnings"]),
        }


CORRECT_RULE = ExampleRule(
    "correct", "an example passes when it is right (the per-example `correct`)", lambda r: float(bool(r.get("correct")))
)


# --------------------------------------------------------------------------- helpers
def ratio(num: float, den: float) -> float:
    """num / den with scikit-learn's ``zero_division=0`` convention."""
    return float(num) / float(den) if den else 0.0


def f1(tp: float, fp: float, fn: float) -> float:
    """F1 = 2 tp / (2 tp + fp + fn), 0 when undefined (scikit-learn ``zero_division=0``)."""
    return ratio(2 * tp, 2 * tp + fp + fn)


def example_f1(tp: float, fp: float, fn: float, valid: bool = True) -> float:
    """Per-example F1; 1.0 when there is nothing to find and nothing was predicted, 0.0 for an
    invalid (unparseable) prediction whatever the reference (a missing value never matches)."""
    if not valid:
        return 0.0
    den = 2 * tp + fp + fn
    return 2 * tp / den if den else 1.0


def copy_records(records: Iterable[dict]) -> list[dict]:
    out = [dict(r) for r in records]
    if not out:
        raise TuneproofError(
            "no examples to score: the output records are empty", hint="check the eval split and eval.max_examples"
        )
    return out


def rid(rec: dict, i: int) -> str:
    return str(rec.get("id", f"#{i}"))


def text(value: Any) -> str:
    return "" if value is None else str(value)


def div(num: Any, den: Any, undefined: float) -> np.ndarray:
    """num / den elementwise; ``undefined`` where den == 0 (0 = sklearn zero_division=0, NaN = skip)."""
    num, den = np.broadcast_arrays(np.asarray(num, dtype=float), np.asarray(den, dtype=float))
    out = np.full(num.shape, undefined, dtype=float)
    np.divide(num, den, out=out, where=den != 0)
    return out


def col(values: Sequence[float]) -> np.ndarray:
    """[n] values -> [n, 1] float block."""
    return np.asarray(values, dtype=float).reshape(-1, 1)


def onehot(keys: Sequence[Any], vocab: Sequence[Any]) -> np.ndarray:
    """[n, len(vocab)] indicator of ``keys[i] == vocab[j]``; a key outside vocab gives a zero row."""
    index = {v: j for j, v in enumerate(vocab)}
    out = np.zeros((len(keys), len(vocab)))
    for i, k in enumerate(keys):
        if k in index:
            out[i, index[k]] = 1.0
    return out


def multihot(sets: Sequence[Iterable[Any] | None], vocab: Sequence[Any]) -> np.ndarray:
    """[n, len(vocab)] indicator of ``vocab[j] in sets[i]`` (None = empty set)."""
    index = {v: j for j, v in enumerate(vocab)}
    out = np.zeros((len(sets), len(vocab)))
    for i, s in enumerate(sets):
        for k in s or ():
            if k in index:
                out[i, index[k]] = 1.0
    return out


def macro_present(values: np.ndarray, support: np.ndarray) -> np.ndarray:
    """Mean of ``values`` [B, L] over the labels with support > 0 in each row (zero-support
    labels are excluded from macro averages, tests/evaluation/test_eval_metrics.py); 0.0 when no label is present."""
    present = (support > 0).astype(float)
    return div((np.nan_to_num(values) * present).sum(axis=1), present.sum(axis=1), 0.0)


def macro_note(labels: Sequence[str], support: dict[str, int], what: str = "labels") -> str:
    """``"macro over 15 of 17 labels present"`` (labels with support 0 are left out)."""
    present = sum(1 for lab in labels if support.get(lab, 0) > 0)
    return f"macro over {present} of {len(labels)} {what} present (support > 0)"


def names(aggregate: list[str], per_class: list[str], per_field: list[str]) -> dict[str, list[str]]:
    return {
        "aggregate": list(aggregate),
        "per_class": [f"per_class_{m}" for m in per_class],
        "per_field": [f"per_field_{m}" for m in per_field],
    }


def is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(float(x))
