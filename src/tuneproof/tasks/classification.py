"""Task kind ``classification``: one label per example (BANKING77's 77 intents).

Parts in the order every task module has them (see :mod:`tuneproof.tasks.task`): reader,
labels, scorer, bootstrap statistics, per-example rule, audit, template.

Metrics are scikit-learn's (``accuracy_score``, ``precision_recall_fscore_support``,
``confusion_matrix``) with ``zero_division=0`` and the label set passed explicitly, so a class the
model never predicts scores 0 instead of vanishing from the average (docs/CASES.md C15). A prediction
outside the label set is wrong and counted in an ``"<invalid>"`` column of the confusion matrix.
Macro averages are over the labels present in the evaluated split (support > 0): a class the split
does not hold cannot be measured there, so it is left out and the metrics say "macro over 15 of
17 labels present" (tests/evaluation/test_eval_metrics.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from tuneproof.errors import TuneproofError
from tuneproof.tasks.parsing import parse_json_output
from tuneproof.tasks.task import (
    BootstrapStats,
    ExampleRule,
    ReaderHints,
    Task,
    TaskConfig,
    col,
    copy_records,
    div,
    macro_note,
    macro_present,
    names,
    onehot,
    rid,
    text,
)

INVALID_LABEL = "<invalid>"


def score_classification(records: Sequence[dict], labels: Sequence[str] | None = None) -> tuple[list[dict], dict]:
    """Score label predictions: accuracy, macro/weighted/micro F1, per-class, confusion matrix.

    Args:
        records: dicts with ``reference`` and ``prediction`` (label strings; surrounding
            whitespace is stripped, case is kept) and optionally ``id`` / ``category``.
        labels: the label set, in report order. Default: the sorted set of references. A
            prediction outside it is wrong (``"<invalid>"``).

    Returns:
        ``(records, metrics)``. Each record gets ``correct`` (bool) and ``scores =
        {"valid_label": bool}``. ``metrics`` keys: ``task``, ``n``, ``labels``, ``per_class``
        (``{label: {"recall", "precision", "f1", "support"}}``, recall first, as docs/CASES.md C15
        asks), ``accuracy``, ``macro_f1``, ``weighted_f1``, ``micro_f1``, ``labels_present``,
        ``macro_over``, ``n_invalid``, ``invalid_rate``, ``confusion`` (``{"labels": rows,
        "columns": labels + ["<invalid>"], "matrix": [[int]]}``; rows are references, columns
        predictions), ``averaging``.

        macro = unweighted mean of per-class F1 over the labels with support > 0 (labels with
        support 0 are excluded, ``macro_over`` says how many are left); weighted = mean
        weighted by support; micro = from pooled tp/fp/fn over the labels (an ``<invalid>``
        prediction is a false negative and no false positive, so micro-F1 can exceed
        accuracy). docs/CASES.md C15 (50 x class 0, 18 x class 1, always 0): accuracy 0.735, class-1
        recall 0.0, macro-F1 0.4237.

    Raises:
        TuneproofError: no records, a missing reference, or a reference outside ``labels``.
    """
    from sklearn.metrics import accuracy_score, confusion_matrix, precision_recall_fscore_support  # noqa: PLC0415 - sklearn.metrics loads only when score_classification() runs

    recs = copy_records(records)
    y_true = []
    for i, r in enumerate(recs):
        if r.get("reference") is None:
            raise TuneproofError(
                f"example {rid(r, i)}: no reference label", hint="every evaluated example needs a label"
            )
        y_true.append(text(r["reference"]).strip())
    if labels is None:
        labels = sorted(set(y_true))
    labels = [str(lab) for lab in labels]
    label_set = set(labels)
    if INVALID_LABEL in label_set:
        raise TuneproofError(f"'{INVALID_LABEL}' is reserved and cannot be a label")
    unknown = [(rid(r, i), ref) for i, (r, ref) in enumerate(zip(recs, y_true)) if ref not in label_set]
    if unknown:  # every one counted, the first 5 named with their example, so all are fixed in one pass
        shown = ", ".join(f"{i} '{ref}'" for i, ref in unknown[:5]) + (
            f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        )
        raise TuneproofError(
            f"{len(unknown)} reference label{'s' if len(unknown) != 1 else ''} not in the label set "
            f"({len(labels)} labels): {shown}",
            hint="pass the full label set",
        )

    y_pred = []
    for r, ref in zip(recs, y_true):
        pred = text(r.get("prediction")).strip()
        valid = bool(pred) and pred in label_set  # an empty answer is never a class (tests/tasks/test_task_rules.py)
        y_pred.append(pred if valid else INVALID_LABEL)
        r["correct"] = bool(valid and pred == ref)
        r["scores"] = {"valid_label": valid}

    prec, rec, f1, sup = precision_recall_fscore_support(y_true, y_pred, labels=labels, average=None, zero_division=0)
    agg = {
        avg: precision_recall_fscore_support(y_true, y_pred, labels=labels, average=avg, zero_division=0)[2]
        for avg in ("weighted", "micro")
    }
    support = {lab: int(sup[k]) for k, lab in enumerate(labels)}
    present = [k for k, lab in enumerate(labels) if support[lab] > 0]
    columns = labels + [INVALID_LABEL]
    cm = confusion_matrix(y_true, y_pred, labels=columns)[: len(labels)]
    n_invalid = sum(p == INVALID_LABEL for p in y_pred)
    n = len(recs)
    note = macro_note(labels, support)
    metrics = {
        "task": "classification",
        "n": n,
        "labels": labels,
        "per_class": {
            lab: {"recall": float(rec[k]), "precision": float(prec[k]), "f1": float(f1[k]), "support": support[lab]}
            for k, lab in enumerate(labels)
        },
        "accuracy": float(accuracy_score(y_true, y_pred)),
        "macro_f1": float(np.mean([f1[k] for k in present])) if present else 0.0,
        "weighted_f1": float(agg["weighted"]),
        "micro_f1": float(agg["micro"]),
        "labels_present": len(present),
        "macro_over": note,
        "n_invalid": int(n_invalid),
        "invalid_rate": n_invalid / n,
        "confusion": {"labels": labels, "columns": columns, "matrix": cm.astype(int).tolist()},
        "averaging": {
            "accuracy": "share of examples whose prediction equals the reference (sklearn accuracy_score)",
            "macro_f1": f"unweighted mean of per-class F1, {note} (sklearn average=None, zero_division=0)",
            "weighted_f1": "mean of per-class F1 weighted by reference support (sklearn average='weighted')",
            "micro_f1": "F1 of tp/fp/fn pooled over the labels (sklearn average='micro'); "
            "<invalid> predictions are false negatives only",
            "per_class": "one-vs-rest precision, recall, F1 per label (sklearn average=None, zero_division=0)",
        },
    }
    return recs, metrics


def _stats(recs: list[dict], labels: list[str]) -> dict:
    refs = [str(r["reference"]).strip() for r in recs]
    preds = [str(r.get("prediction") or "").strip() for r in recs]
    ref1, pred1 = onehot(refs, labels), onehot(preds, labels)
    return {"correct": col([r["correct"] for r in recs]), "tp": ref1 * pred1, "pred": pred1, "sup": ref1}


def _metric_fn(labels: list[str]):
    def fn(z: dict, n: int, undefined: float) -> dict:
        tp, pr, su = z["tp"], z["pred"], z["sup"]
        f1_0 = div(2 * tp, pr + su, 0.0)
        out: dict = {
            "accuracy": z["correct"][:, 0] / n,
            "macro_f1": macro_present(f1_0, su),
            "weighted_f1": div((f1_0 * su).sum(axis=1), su.sum(axis=1), 0.0),
            "micro_f1": div(2 * tp.sum(axis=1), pr.sum(axis=1) + su.sum(axis=1), 0.0),
        }
        rec, prec, f1 = div(tp, su, undefined), div(tp, pr, undefined), div(2 * tp, pr + su, undefined)
        for j, lab in enumerate(labels):
            out[("per_class", lab, "recall")] = rec[:, j]
            out[("per_class", lab, "precision")] = prec[:, j]
            out[("per_class", lab, "f1")] = f1[:, j]
        return out

    return fn


class Classification(Task):
    name = "classification"
    template = "classification.yaml"
    reader = ReaderHints(
        label="data.fields.label: the class name (one per example)",
        target="the label text itself (generative models answer with it)",
        model_kinds=("sequence-classification", "causal-lm"),
    )
    headline = ("accuracy", "macro_f1")
    per_class_metric = "recall"
    has_confusion = True
    has_label_set = True

    def label_set(self, train_examples: Iterable[Any]) -> list[str] | None:
        return sorted({e.label for e in train_examples if e.label is not None})

    def metric_names(self, cfg: TaskConfig) -> dict[str, list[str]]:
        return names(["accuracy", "macro_f1", "weighted_f1", "micro_f1"], ["recall", "precision", "f1"], [])

    def score(self, records, cfg: TaskConfig):
        return score_classification(records, labels=cfg.labels)

    def bootstrap_stats(self, base, cand, base_m, cand_m, cfg) -> BootstrapStats:
        labels = list(base_m["labels"])
        return BootstrapStats(
            _stats(base, labels), _stats(cand, labels), _metric_fn(labels), [str(r["reference"]).strip() for r in base]
        )

    def example_rule(self, metric: str | None) -> ExampleRule:
        return ExampleRule(
            "correct",
            "an example passes when its predicted class is the reference class",
            lambda r: float(bool(r.get("correct"))),
        )

    def predicted_key(self, rec: dict) -> str | None:
        return text(rec.get("prediction")).strip() or None

    def reference_key(self, rec: dict) -> str | None:
        return text(rec.get("reference")).strip() or None

    def audit(self, splits, cfg: TaskConfig) -> dict[str, Any]:
        """The label audit, plus a hard fault when the label field holds lists (a multi-label task)."""
        out = super().audit(splits, cfg)
        lists = [
            e
            for v in splits.values()
            for e in v
            if isinstance(e.label, str) and e.label.startswith("[") and isinstance(parse_json_output(e.label)[0], list)
        ]
        if lists:
            shown = ", ".join(e.source or e.id for e in lists[:5]) + (
                f" and {len(lists) - 5} more" if len(lists) > 5 else ""
            )
            out["hard_faults"].insert(
                0,
                f"{len(lists)} label(s) are lists, e.g. {shown}: a set of labels per example is a multi-label "
                "task (set hypothesis.task: multi-label)",
            )
        return out

    def failure_kind(self, rec: dict) -> str:
        sc = rec.get("scores") or {}
        if sc.get("valid_label") is False:
            return "not one of the labels"
        return f"{rec.get('reference')} predicted as {rec.get('prediction')}"


TASK = Classification()
