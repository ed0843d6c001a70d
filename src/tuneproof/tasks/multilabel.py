"""Task kind ``multi-label``: a set of labels per example (the target is a JSON array of labels).

Parts in the order every task module has them (see :mod:`tuneproof.tasks.task`): reader,
labels, scorer, bootstrap statistics, per-example rule, audit, template.

Scoring is set-based (scikit-learn's multilabel conventions, ``zero_division=0``): per-label
precision / recall / F1 one-vs-rest, micro (tp/fp/fn pooled over labels and examples), macro
(mean of per-label F1 over the labels present in the split, support > 0, "macro over 15 of 17
labels present"), exact set match (sklearn's subset accuracy). Order and repetition inside the
array never matter. An output that is not a JSON array of strings predicts nothing and is never
right, whatever the reference (a missing value never matches, docs/CASES.md C20).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from tuneproof.data.audit import audit_label_sets
from tuneproof.errors import TuneproofError
from tuneproof.tasks.parsing import parse_json_output, reason_kind
from tuneproof.tasks.task import (
    PASS_F1,
    BootstrapStats,
    ExampleRule,
    ReaderHints,
    Task,
    TaskConfig,
    col,
    copy_records,
    div,
    example_f1,
    f1,
    macro_note,
    macro_present,
    multihot,
    names,
    ratio,
    rid,
    text,
)


def parse_label_set(value: Any, allow_fenced: bool = False) -> tuple[frozenset | None, str | None]:
    """A label set from a JSON array of strings (or an already parsed list).

    Returns ``(set, None)`` or ``(None, reason)``; labels are stripped, empty ones dropped.
    """
    if isinstance(value, (list, tuple)):
        obj, err = list(value), None
    else:
        obj, err = parse_json_output(text(value), allow_fenced=allow_fenced)
    if err is not None:
        return None, err
    if not isinstance(obj, list) or not all(isinstance(x, str) for x in obj):
        return None, f"not_label_list: expected a JSON array of label strings, got {type(obj).__name__}"
    return frozenset(x.strip() for x in obj if x.strip()), None


def example_label_set(ex: Any) -> frozenset | None:
    """The label set of an :class:`~tuneproof.data.examples.Example`: its target (what the model is
    taught and scored against) as a JSON array of strings, else None."""
    if ex.target is None:
        return None
    s, err = parse_label_set(ex.target)
    return s if err is None else None


def score_multilabel(
    records: Sequence[dict], labels: Sequence[str] | None = None, allow_fenced: bool = False
) -> tuple[list[dict], dict]:
    """Score label-set predictions.

    Args:
        records: dicts with ``reference`` and ``prediction`` (JSON arrays of label strings).
        labels: the label vocabulary (default: the labels of the references); predicted labels
            outside it count as false positives (``unknown_predicted_labels``).
        allow_fenced: accept a ``` fenced prediction.

    Per example ``scores``: ``valid`` (a JSON array of strings), ``parse_error``, ``ref_labels`` /
    ``pred_labels`` (sorted lists; pred None when invalid), ``tp`` / ``fp`` / ``fn`` (label counts)
    and ``example_f1`` (0 for an invalid prediction); ``correct`` = exact set match of a valid
    prediction.

    Returns:
        ``(records, metrics)`` with ``task``, ``n``, ``labels``, ``json_valid_rate``,
        ``exact_set_match``, ``micro_precision``, ``micro_recall``, ``micro_f1``, ``macro_f1``,
        ``labels_present``, ``macro_over``, ``per_class`` (per label ``{"precision", "recall",
        "f1", "support"}``), ``unknown_predicted_labels`` (``{label: count}``), ``parse_errors``,
        ``averaging``. docs/CASES.md C20: reference ``["a", "b"]``, predictions ``{}``, ``{"slots": {}}``,
        ``["c"]``, ``["b", "a"]`` -> exact_set_match 0.25.

    Raises:
        TuneproofError: no records, or a reference that is not a JSON array of strings.
    """
    recs = copy_records(records)
    refs = []
    for i, r in enumerate(recs):
        s, err = parse_label_set(r.get("reference"))
        if err is not None:
            raise TuneproofError(
                f"example {rid(r, i)}: the reference is not a JSON array of labels ({err})",
                hint="run `tuneproof data check`: every multi-label target must be a JSON array of strings",
            )
        refs.append(s)
    vocab = sorted(set(labels)) if labels is not None else sorted({lab for s in refs for lab in s})
    vocab = sorted(set(vocab) | {lab for s in refs for lab in s})
    known = set(vocab)
    tp_l = dict.fromkeys(vocab, 0)
    fp_l = dict.fromkeys(vocab, 0)
    sup_l = dict.fromkeys(vocab, 0)
    unknown: dict[str, int] = {}
    parse_errors: dict[str, int] = {}
    n_valid = n_exact = tp = fp = fn = 0
    for r, ref in zip(recs, refs):
        pred, err = parse_label_set(r.get("prediction"), allow_fenced=allow_fenced)
        valid = err is None
        ps = pred or frozenset()
        a, b, c = len(ps & ref), len(ps - ref), len(ref - ps)
        exact = bool(valid and ps == ref)
        for lab in ref:
            sup_l[lab] += 1
        for lab in ps:
            if lab in known:
                tp_l[lab] += lab in ref
                fp_l[lab] += lab not in ref
            else:
                unknown[lab] = unknown.get(lab, 0) + 1
        if not valid:
            k = reason_kind(err)
            parse_errors[k] = parse_errors.get(k, 0) + 1
        n_valid += valid
        n_exact += exact
        tp, fp, fn = tp + a, fp + b, fn + c
        r["correct"] = exact
        r["scores"] = {
            "valid": valid,
            "parse_error": err,
            "ref_labels": sorted(ref),
            "pred_labels": None if pred is None else sorted(pred),
            "tp": a,
            "fp": b,
            "fn": c,
            "example_f1": example_f1(a, b, c, valid=valid),
        }
    n = len(recs)
    per_class = {
        lab: {
            "precision": ratio(tp_l[lab], tp_l[lab] + fp_l[lab]),
            "recall": ratio(tp_l[lab], sup_l[lab]),
            "f1": f1(tp_l[lab], fp_l[lab], sup_l[lab] - tp_l[lab]),
            "support": sup_l[lab],
        }
        for lab in vocab
    }
    present = [lab for lab in vocab if sup_l[lab] > 0]
    note = macro_note(vocab, sup_l)
    metrics = {
        "task": "multi-label",
        "n": n,
        "labels": vocab,
        "json_valid_rate": n_valid / n,
        "exact_set_match": n_exact / n,
        "micro_precision": ratio(tp, tp + fp),
        "micro_recall": ratio(tp, tp + fn),
        "micro_f1": f1(tp, fp, fn),
        "macro_f1": float(np.mean([per_class[lab]["f1"] for lab in present])) if present else 0.0,
        "labels_present": len(present),
        "macro_over": note,
        "per_class": per_class,
        "unknown_predicted_labels": dict(sorted(unknown.items())),
        "parse_errors": dict(sorted(parse_errors.items())),
        "averaging": {
            "exact_set_match": "share of examples whose predicted label set equals the reference set (subset accuracy)",
            "micro_f1": "F1 of label tp/fp/fn pooled over all labels and examples; unknown labels are false positives",
            "macro_f1": f"unweighted mean of per-label F1, {note}",
            "per_class": "one-vs-rest precision, recall, F1 per label (zero_division=0)",
        },
    }
    return recs, metrics


def _stats(recs: list[dict], labels: list[str]) -> dict:
    sc = [r["scores"] for r in recs]
    ref1 = multihot([s["ref_labels"] for s in sc], labels)
    pred1 = multihot([s["pred_labels"] for s in sc], labels)
    return {
        "valid": col([s["valid"] for s in sc]),
        "exact": col([r["correct"] for r in recs]),
        "tp": col([s["tp"] for s in sc]),
        "fp": col([s["fp"] for s in sc]),
        "fn": col([s["fn"] for s in sc]),
        "l_tp": ref1 * pred1,
        "l_pred": pred1,
        "l_sup": ref1,
    }


def _metric_fn(labels: list[str]):
    def fn(z: dict, n: int, undefined: float) -> dict:
        tp, fp, fneg = z["tp"][:, 0], z["fp"][:, 0], z["fn"][:, 0]
        ltp, lpr, lsu = z["l_tp"], z["l_pred"], z["l_sup"]
        out: dict = {
            "json_valid_rate": z["valid"][:, 0] / n,
            "exact_set_match": z["exact"][:, 0] / n,
            "micro_precision": div(tp, tp + fp, 0.0),
            "micro_recall": div(tp, tp + fneg, 0.0),
            "micro_f1": div(2 * tp, 2 * tp + fp + fneg, 0.0),
            "macro_f1": macro_present(div(2 * ltp, lpr + lsu, 0.0), lsu),
        }
        rec, prec, f1_ = div(ltp, lsu, undefined), div(ltp, lpr, undefined), div(2 * ltp, lpr + lsu, undefined)
        for j, lab in enumerate(labels):
            out[("per_class", lab, "recall")] = rec[:, j]
            out[("per_class", lab, "precision")] = prec[:, j]
            out[("per_class", lab, "f1")] = f1_[:, j]
        return out

    return fn


class MultiLabel(Task):
    name = "multi-label"
    template = "multi-label.yaml"
    reader = ReaderHints(
        label="data.fields.label (optional): a category for stratified splits",
        target="data.fields.target: a list of labels (a JSON array, or a list in JSON/JSONL sources)",
        model_kinds=("causal-lm",),
    )
    headline = ("json_valid_rate", "micro_f1", "macro_f1", "exact_set_match")
    per_class_metric = "recall"
    has_label_set = True

    def label_set(self, train_examples: Iterable[Any]) -> list[str] | None:
        return sorted({lab for e in train_examples for lab in (example_label_set(e) or ())})

    def metric_names(self, cfg: TaskConfig) -> dict[str, list[str]]:
        return names(
            ["json_valid_rate", "exact_set_match", "micro_precision", "micro_recall", "micro_f1", "macro_f1"],
            ["recall", "precision", "f1"],
            [],
        )

    def score(self, records, cfg: TaskConfig):
        return score_multilabel(records, labels=cfg.labels, allow_fenced=cfg.eval.allow_fenced_json)

    def bootstrap_stats(self, base, cand, base_m, cand_m, cfg) -> BootstrapStats:
        labels = list(base_m["labels"])
        return BootstrapStats(
            _stats(base, labels),
            _stats(cand, labels),
            _metric_fn(labels),
            ["|".join(r["scores"]["ref_labels"]) for r in base],
        )

    def example_rule(self, metric: str | None) -> ExampleRule:
        if metric == "json_valid_rate":
            return ExampleRule(
                "valid",
                "an example passes when its output is a JSON array of labels",
                lambda r: float(r["scores"]["valid"]),
            )
        if metric in ("exact_set_match", None):
            return ExampleRule(
                "correct",
                "an example passes when its predicted label set equals the reference set",
                lambda r: float(bool(r.get("correct"))),
            )
        return ExampleRule(
            "example_f1",
            f"an example passes when the F1 of its label set is >= {PASS_F1:g}",
            lambda r: float(r["scores"]["example_f1"]),
            PASS_F1,
        )

    def predicted_key(self, rec: dict) -> str | None:
        p = (rec.get("scores") or {}).get("pred_labels")
        return json.dumps(p) if p is not None else None

    def reference_key(self, rec: dict) -> str | None:
        p = (rec.get("scores") or {}).get("ref_labels")
        return json.dumps(p) if p is not None else None

    def failure_kind(self, rec: dict) -> str:
        sc = rec.get("scores") or {}
        if sc.get("parse_error"):
            return str(sc["parse_error"]).split(":", 1)[0].strip() or "not a label list"
        if sc.get("fn") and not sc.get("fp"):
            return "labels missing"
        if sc.get("fp") and not sc.get("fn"):
            return "extra labels"
        return "wrong labels"

    def audit(self, splits, cfg: TaskConfig) -> dict[str, Any]:
        sets, bad = {}, []
        for name, items in splits.items():
            sets[name] = []
            for e in items:
                s = example_label_set(e)
                sets[name].append(None if s is None else sorted(s))
                if s is None:
                    bad.append(e.source or e.id)
        ls = audit_label_sets(
            sets,
            what="label",
            sources={name: [e.source or e.id for e in items] for name, items in splits.items()},
            reserved=cfg.test_split,
        )
        hard = list(ls["hard_faults"])
        n = sum(len(v) for v in splits.values())
        if bad:
            hard.insert(
                0,
                f"{len(bad)} of {n} targets are not a JSON array of labels: {', '.join(bad[:5])}"
                + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
                + " (map the list column with data.fields.target)",
            )
        return {
            "labels": None,
            "label_sets": ls,
            "targets": {"n": n, "invalid": bad},
            "hard_faults": hard,
            "warnings": list(ls["warnings"]),
        }


TASK = MultiLabel()
