"""Task kind ``extraction``: strict JSON ``{"intent": ..., "slots": {slot: value | [values]}}`` (SNIPS).

Parts in the order every task module has them (see :mod:`tuneproof.tasks.base`): reader,
labels, scorer, bootstrap statistics, per-example rule, audit, template.

Rules and where they come from:

- field precision/recall/F1 are micro-averaged over (slot, value) pairs, as in the slot-F1 of the
  SNIPS / ATIS literature, with values normalised by ``strip`` + ``casefold``; a list value gives
  one pair per element, so list order never matters.
- ``intent`` may be one string or a list of strings (multi-intent): it is compared as a *set*
  (``"a"`` equals ``["a"]``, ``["a", "b"]`` equals ``["b", "a"]``). A missing, non-string or
  unparseable intent is always wrong, never a match: ``{}`` against ``{"intent": ["a", "b"]}`` is
  wrong (docs/CASES.md C20). A reference without an intent is not scored on the intent at all.
- JSON validity is strict RFC 8259 (:func:`tuneproof.tasks.parsing.parse_json_output`);
  a fenced output is invalid unless ``eval.allow_fenced_json`` (docs/CASES.md C16).
- An example is *answered* when its output is a valid JSON object holding every required field
  (``hypothesis.required_fields``, default ``intent`` and ``slots``) with a value: not null, not an
  empty string, an ``intent`` that is a non-empty string or list of strings, ``slots`` an object. Every
  per-example rule (the basis of fixed / broken and McNemar's test) fails an example that is not
  answered: ``{}`` for a reference without slots has field F1 1.0, yet it is never a fixed example
  (tests/tasks/test_task_rules.py: a model that says nothing must not count as fixed). A required field
  the reference leaves empty (null, ``""``, ``[]``, ``{}``: an optional field) is answered by an empty value,
  and one the reference lacks by its absence: a copy of the reference passes every rule
  (``{"intent": ["a"], "slots": null}`` against itself; tests/tasks/test_task_matrix.py), so fixed / broken
  and McNemar's test count every row.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from tuneproof.data.audit import audit_label_sets, audit_labels, audit_targets, json_list_field
from tuneproof.errors import TuneproofError
from tuneproof.tasks.base import (
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
from tuneproof.tasks.parsing import parse_json_output, reason_kind

DEFAULT_FIELDS = ["intent", "slots"]
MULTI_INTENT_METRICS = [
    "intent_precision",
    "intent_recall",
    "intent_micro_f1",
    "intent_macro_f1",
]  # when an intent is a list


def _norm_value(v: Any) -> str:
    if isinstance(v, str):
        return v.strip().casefold()
    if isinstance(v, (dict, list)):
        return json.dumps(v, sort_keys=True, ensure_ascii=False).casefold()
    return json.dumps(v).casefold()  # numbers, booleans, null: their JSON text


def slot_pairs(slots: Any) -> Counter:
    """Multiset of normalised (slot, value) pairs; a list value gives one pair per element."""
    pairs: Counter = Counter()
    if not isinstance(slots, dict):
        return pairs
    for name, value in slots.items():
        values = value if isinstance(value, list) else [value]
        for v in values:
            pairs[(str(name), _norm_value(v))] += 1
    return pairs


def intent_set(obj: Any) -> frozenset | None:
    """The intent of an object as a set of stripped strings; None when missing or not a string /
    list of strings (a missing value never matches anything)."""
    if not isinstance(obj, dict) or "intent" not in obj:
        return None
    v = obj["intent"]
    if isinstance(v, str):
        return frozenset([v.strip()]) if v.strip() else None
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return frozenset(x.strip() for x in v if x.strip())
    return None


def _empty(value: Any) -> bool:
    """A value that holds no answer: null, a blank string, ``[]`` or ``{}``."""
    return value is None or value == [] or value == {} or (isinstance(value, str) and not value.strip())


def _left_out(key: str, pred: dict, ref: Any) -> bool:
    """``key`` is left out of ``pred`` as the reference ``ref`` leaves it out: absent from both, or empty in
    both (:func:`_empty`: an optional field). False without a reference object."""
    if not isinstance(ref, dict):
        return False
    if key not in ref:
        return key not in pred
    return _empty(ref[key]) and key in pred and _empty(pred[key])


def answered(pred: Any, required: Sequence[str], ref: Any = None) -> bool:
    """True when ``pred`` (a parsed output) is an object holding every required field with a value:
    not null, not an empty string; ``intent`` a non-empty string or list of strings (:func:`intent_set`),
    ``slots`` an object (``{}`` is an answer: no slots). The gate of every per-example rule of this kind (see the module
    docstring).

    ``ref`` (the parsed reference): a required field the reference leaves empty (null, ``""``, ``[]``,
    ``{}``: an optional field, ``data.fields.optional``) is answered by an empty value too, and one the
    reference lacks by its absence; so a copy of the reference is always answered, while an output that
    drops a field the reference fills never is."""
    if not isinstance(pred, dict):
        return False
    for key in required:
        value = pred.get(key)
        if _left_out(key, pred, ref):
            continue
        if value is None or (isinstance(value, str) and not value.strip()):
            return False
        if key == "intent" and not intent_set(pred):  # None (not strings) or an empty list
            return False
        if key == "slots" and not isinstance(value, dict):
            return False
    return True


def _canonical(obj: dict) -> dict:
    """Object with slot values normalised (strip + casefold, order-free) and the intent as a
    sorted set, for exact match; an absent, null or empty ``slots`` equals ``{}``."""
    out = {}
    for k, v in obj.items():
        if k == "slots":
            if isinstance(v, dict):
                if v:
                    out[k] = sorted(slot_pairs(v).elements())
            elif not _empty(v):  # null, [] and {} all say "no slots"
                out[k] = v
        elif k == "intent":
            s = intent_set(obj)
            out[k] = sorted(s) if s is not None else ("<invalid>", json.dumps(v, sort_keys=True))
        else:
            out[k] = v
    return out


def score_extraction(
    records: Sequence[dict], required_fields: Sequence[str] | None = None, allow_fenced: bool = False
) -> tuple[list[dict], dict]:
    """Score structured extraction outputs ``{"intent": str | [str], "slots": {slot: value | [values]}}``.

    Args:
        records: dicts with ``reference`` and ``prediction`` (JSON strings), ``id``, ``category``.
        required_fields: top-level keys every output must have; empty/None means
            ``["intent", "slots"]`` (CONTRACTS.md).
        allow_fenced: accept a ``` fenced prediction (``eval.allow_fenced_json``).

    Per example, ``scores`` holds ``json_valid`` (strict parse), ``parse_error`` (reason or
    None), ``required_present``, ``answered`` (:func:`answered`: every required field present with a
    value; the gate of the per-example rules), ``has_intent`` (the reference has one), ``intent_correct``
    (sets equal; False whenever the prediction has no valid intent), ``tp`` / ``fp`` / ``fn``
    (counts of (slot, value) pairs), ``ref_intent`` / ``pred_intent`` (sorted lists or None),
    ``classes`` (the reference intents, else ``[category]``, else ``["<none>"]``), ``class``
    (them joined by ``|``), ``field_f1`` (per-example F1 of the pairs, 0 for an invalid
    prediction) and ``fields`` (``{slot: [tp, fp, fn]}``). ``correct`` = exact match: a valid
    object equal to the reference after normalisation (slot values strip + casefold, value
    order ignored, ``"x"`` equals ``["x"]``, intent as a set).

    Returns:
        ``(records, metrics)`` with keys ``task``, ``n``, ``required_fields``,
        ``json_valid_rate``, ``required_fields_rate``, ``exact_match``, ``field_precision``,
        ``field_recall``, ``field_f1`` (micro over pairs), ``tp``, ``fp``, ``fn``,
        ``parse_errors`` (``{kind: count}``), ``per_class`` (per reference intent label, or per
        category when the reference has no intent: ``{"support", "recall", "precision", "f1",
        "exact_match", "field_precision", "field_recall", "field_f1"}``; recall/precision/F1 of
        the intent label one-vs-rest, only for intent labels), ``per_field`` (``{"precision",
        "recall", "f1", "support", "exact_match_rate"}``), ``unknown_predicted_fields``,
        ``averaging``; ``intent_accuracy`` (set match over the ``intent_n`` examples whose
        reference has an intent; absent when none has) and, when some reference intent is a list,
        ``intent_precision``, ``intent_recall``, ``intent_micro_f1`` (pooled over labels),
        ``intent_macro_f1`` (over labels present) and ``intent_macro_over``.

    Raises:
        TuneproofError: no records, or a reference that is not a strict JSON object (names the id).
    """
    recs = copy_records(records)
    required = list(required_fields or DEFAULT_FIELDS)
    n = len(recs)
    totals: Counter = Counter()
    parse_errors: Counter = Counter()
    per_field_counts: dict[str, Counter] = {}
    class_stats: dict[str, Counter] = {}
    intent_labels: set[str] = set()
    multi_intent = False

    parsed = []
    for i, r in enumerate(recs):
        ref, ref_err = parse_json_output(text(r.get("reference")), allow_fenced=False)
        if ref_err is not None or not isinstance(ref, dict):
            raise TuneproofError(
                f"example {rid(r, i)}: the reference is not a strict JSON object ({ref_err or type(ref).__name__})",
                hint="run `tuneproof data check`: every extraction target must be strict JSON",
            )
        multi_intent |= isinstance(ref.get("intent"), list)
        ri = intent_set(ref)
        if ri:
            intent_labels |= ri
        parsed.append((ref, ri))

    for r, (ref, ref_int) in zip(recs, parsed):
        pred, err = parse_json_output(text(r.get("prediction")), allow_fenced=allow_fenced)
        valid = err is None
        is_obj = valid and isinstance(pred, dict)
        if not valid:
            parse_errors[reason_kind(err)] += 1
        elif not is_obj:
            parse_errors["not_object"] += 1
        required_present = bool(is_obj and all(k in pred or _left_out(k, pred, ref) for k in required))
        is_answered = bool(valid and answered(pred, required, ref))
        ref_pairs = slot_pairs(ref.get("slots"))
        pred_pairs = slot_pairs(pred.get("slots")) if is_obj else Counter()
        tp_pairs = ref_pairs & pred_pairs
        tp, fp, fn = (
            sum(tp_pairs.values()),
            sum((pred_pairs - ref_pairs).values()),
            sum((ref_pairs - pred_pairs).values()),
        )
        has_intent = ref_int is not None
        pred_int = intent_set(pred) if is_obj else None
        intent_correct = bool(has_intent and pred_int is not None and pred_int == ref_int)
        exact = bool(is_obj and _canonical(pred) == _canonical(ref))

        fields: dict[str, list[int]] = {}
        for (slot, _v), c in ref_pairs.items():
            fields.setdefault(slot, [0, 0, 0])[2] += c
        for (slot, _v), c in pred_pairs.items():
            fields.setdefault(slot, [0, 0, 0])[1] += c
        for (slot, _v), c in tp_pairs.items():
            fields[slot][0] += c
            fields[slot][1] -= c
            fields[slot][2] -= c
        ref_slots = {s for s, _ in ref_pairs}
        for slot, (ftp, ffp, ffn) in fields.items():
            pc = per_field_counts.setdefault(slot, Counter())
            pc.update(tp=ftp, fp=ffp, fn=ffn)
            if slot in ref_slots:
                pc.update(support=ftp + ffn, examples=1, exact=int(ffp == 0 and ffn == 0))

        classes = sorted(ref_int) if ref_int else [text(r.get("category")) or "<none>"]
        pset = pred_int or frozenset()
        i_tp = len(pset & ref_int) if has_intent else 0
        i_fp = len(pset - ref_int) if has_intent else 0
        i_fn = len(ref_int - pset) if has_intent else 0
        for cls in classes:
            cs = class_stats.setdefault(cls, Counter())
            cs.update(support=1, exact=int(exact), tp=tp, fp=fp, fn=fn)
        if has_intent:
            for lab in pset & intent_labels:
                class_stats.setdefault(lab, Counter())["intent_pred"] += 1
            for lab in pset & ref_int:
                class_stats[lab]["intent_tp"] += 1

        totals.update(
            valid=int(valid),
            required=int(required_present),
            has_intent=int(has_intent),
            intent=int(intent_correct),
            exact=int(exact),
            tp=tp,
            fp=fp,
            fn=fn,
            i_tp=i_tp,
            i_fp=i_fp,
            i_fn=i_fn,
        )
        r["correct"] = exact
        r["scores"] = {
            "json_valid": valid,
            "parse_error": err if not valid else (None if is_obj else "not_object: the JSON is not an object"),
            "required_present": required_present,
            "answered": is_answered,
            "has_intent": has_intent,
            "intent_correct": intent_correct,
            "tp": tp,
            "fp": fp,
            "fn": fn,
            "field_f1": example_f1(tp, fp, fn, valid=is_obj),
            "intent_tp": i_tp,
            "intent_fp": i_fp,
            "intent_fn": i_fn,
            "ref_intent": None if ref_int is None else sorted(ref_int),
            "pred_intent": None if pred_int is None else sorted(pred_int),
            "classes": classes,
            "class": "|".join(classes),
            "fields": fields,
        }

    tp, fp, fn = totals["tp"], totals["fp"], totals["fn"]
    per_class = {}
    for cls in sorted(class_stats):
        cs = class_stats[cls]
        if cs["support"] == 0:  # a label only ever predicted: not a class of this split
            continue
        entry = {"support": cs["support"]}
        if cls in intent_labels:
            entry.update(
                recall=ratio(cs["intent_tp"], cs["support"]),
                precision=ratio(cs["intent_tp"], cs["intent_pred"]),
                f1=f1(cs["intent_tp"], cs["intent_pred"] - cs["intent_tp"], cs["support"] - cs["intent_tp"]),
            )
        entry.update(
            exact_match=ratio(cs["exact"], cs["support"]),
            field_precision=ratio(cs["tp"], cs["tp"] + cs["fp"]),
            field_recall=ratio(cs["tp"], cs["tp"] + cs["fn"]),
            field_f1=f1(cs["tp"], cs["fp"], cs["fn"]),
        )
        per_class[cls] = entry
    per_field, unknown = {}, {}
    for slot in sorted(per_field_counts):
        pc = per_field_counts[slot]
        if pc["support"] == 0:
            unknown[slot] = pc["fp"]
            continue
        per_field[slot] = {
            "precision": ratio(pc["tp"], pc["tp"] + pc["fp"]),
            "recall": ratio(pc["tp"], pc["tp"] + pc["fn"]),
            "f1": f1(pc["tp"], pc["fp"], pc["fn"]),
            "support": pc["support"],
            "exact_match_rate": ratio(pc["exact"], pc["examples"]),
        }
    metrics: dict[str, Any] = {
        "task": "extraction",
        "n": n,
        "required_fields": required,
        "json_valid_rate": totals["valid"] / n,
        "required_fields_rate": totals["required"] / n,
    }
    if totals["has_intent"]:
        metrics["intent_accuracy"] = ratio(totals["intent"], totals["has_intent"])
        metrics["intent_n"] = totals["has_intent"]
    if multi_intent:
        labs = sorted(intent_labels)
        metrics["intent_precision"] = ratio(totals["i_tp"], totals["i_tp"] + totals["i_fp"])
        metrics["intent_recall"] = ratio(totals["i_tp"], totals["i_tp"] + totals["i_fn"])
        metrics["intent_micro_f1"] = f1(totals["i_tp"], totals["i_fp"], totals["i_fn"])
        metrics["intent_macro_f1"] = float(np.mean([per_class[lab]["f1"] for lab in labs])) if labs else 0.0
        metrics["intent_macro_over"] = macro_note(
            labs, {lab: per_class[lab]["support"] for lab in labs}, "intent labels"
        )
    metrics.update(
        {
            "exact_match": totals["exact"] / n,
            "field_precision": ratio(tp, tp + fp),
            "field_recall": ratio(tp, tp + fn),
            "field_f1": f1(tp, fp, fn),
            "tp": tp,
            "fp": fp,
            "fn": fn,
            "parse_errors": dict(sorted(parse_errors.items())),
            "per_class": per_class,
            "per_field": per_field,
            "unknown_predicted_fields": unknown,
            "averaging": {
                "field_f1": "micro: F1 of (slot, value) pairs pooled over all examples; values stripped and casefolded",
                "intent_accuracy": "share of examples with a reference intent whose predicted "
                "intent set equals it (missing = wrong)",
                "exact_match": "share of examples whose whole object equals the reference after value normalisation",
                "per_class": "per reference intent label (one-vs-rest); per category for references without intent",
                "per_field": "per slot name, pairs pooled over examples",
            },
        }
    )
    return recs, metrics


# --------------------------------------------------------------------------- bootstrap statistics
def _stats(recs: list[dict], classes: list[str], intent_classes: list[str], fields: list[str]) -> dict:
    sc = [r["scores"] for r in recs]
    member = multihot([s["classes"] for s in sc], classes)
    has = col([s["has_intent"] for s in sc])
    ipred = multihot([s["pred_intent"] if s["has_intent"] else None for s in sc], intent_classes)
    isup = multihot([s["ref_intent"] for s in sc], intent_classes)
    intent_ok = col([s["intent_correct"] for s in sc])
    exact = col([r["correct"] for r in recs])
    tp, fp, fn = col([s["tp"] for s in sc]), col([s["fp"] for s in sc]), col([s["fn"] for s in sc])
    ftp, ffp, ffn = (np.zeros((len(recs), len(fields))) for _ in range(3))
    fhas, fexact = np.zeros_like(ftp), np.zeros_like(ftp)
    findex = {f: j for j, f in enumerate(fields)}
    for i, s in enumerate(sc):
        for slot, (a, b, c) in s["fields"].items():
            j = findex.get(slot)
            if j is None:
                continue
            ftp[i, j], ffp[i, j], ffn[i, j] = a, b, c
            if a + c > 0:  # the reference has this slot
                fhas[i, j] = 1.0
                fexact[i, j] = float(b == 0 and c == 0)
    return {
        "valid": col([s["json_valid"] for s in sc]),
        "required": col([s["required_present"] for s in sc]),
        "has_intent": has,
        "intent": intent_ok,
        "exact": exact,
        "tp": tp,
        "fp": fp,
        "fn": fn,
        "i_tp": col([s["intent_tp"] for s in sc]),
        "i_fp": col([s["intent_fp"] for s in sc]),
        "i_fn": col([s["intent_fn"] for s in sc]),
        "c_member": member,
        "c_exact": member * exact,
        "c_tp": member * tp,
        "c_fp": member * fp,
        "c_fn": member * fn,
        "i_sup": isup,
        "i_pred": ipred,
        "i_lab_tp": isup * ipred,
        "f_tp": ftp,
        "f_fp": ffp,
        "f_fn": ffn,
        "f_has": fhas,
        "f_exact": fexact,
    }


def _metric_fn(classes: list[str], intent_classes: list[str], fields: list[str], keys: set[str]):
    def fn(z: dict, n: int, undefined: float) -> dict:
        tp, fp, fneg = z["tp"][:, 0], z["fp"][:, 0], z["fn"][:, 0]
        out: dict = {
            "json_valid_rate": z["valid"][:, 0] / n,
            "required_fields_rate": z["required"][:, 0] / n,
            "exact_match": z["exact"][:, 0] / n,
            "field_precision": div(tp, tp + fp, 0.0),
            "field_recall": div(tp, tp + fneg, 0.0),
            "field_f1": div(2 * tp, 2 * tp + fp + fneg, 0.0),
        }
        if "intent_accuracy" in keys:
            out["intent_accuracy"] = div(z["intent"][:, 0], z["has_intent"][:, 0], 0.0)
        itp, ipr, isu = z["i_lab_tp"], z["i_pred"], z["i_sup"]
        lab_f1_0 = div(2 * itp, ipr + isu, 0.0)
        if "intent_micro_f1" in keys:
            a, b, c = z["i_tp"][:, 0], z["i_fp"][:, 0], z["i_fn"][:, 0]
            out["intent_precision"] = div(a, a + b, 0.0)
            out["intent_recall"] = div(a, a + c, 0.0)
            out["intent_micro_f1"] = div(2 * a, 2 * a + b + c, 0.0)
            out["intent_macro_f1"] = macro_present(lab_f1_0, isu)
        m = z["c_member"]
        ctp, cfp, cfn = z["c_tp"], z["c_fp"], z["c_fn"]
        per_c = {
            "exact_match": div(z["c_exact"], m, undefined),
            "field_precision": div(ctp, ctp + cfp, undefined),
            "field_recall": div(ctp, ctp + cfn, undefined),
            "field_f1": div(2 * ctp, 2 * ctp + cfp + cfn, undefined),
        }
        per_i = {
            "recall": div(itp, isu, undefined),
            "precision": div(itp, ipr, undefined),
            "f1": div(2 * itp, ipr + isu, undefined),
        }
        ipos = {c: j for j, c in enumerate(intent_classes)}
        for j, c in enumerate(classes):
            if c in ipos:
                for key, arr in per_i.items():
                    out[("per_class", c, key)] = arr[:, ipos[c]]
            for key, arr in per_c.items():
                out[("per_class", c, key)] = arr[:, j]
        ftp, ffp, ffn = z["f_tp"], z["f_fp"], z["f_fn"]
        per_f = {
            "precision": div(ftp, ftp + ffp, undefined),
            "recall": div(ftp, ftp + ffn, undefined),
            "f1": div(2 * ftp, 2 * ftp + ffp + ffn, undefined),
            "exact_match_rate": div(z["f_exact"], z["f_has"], undefined),
        }
        for j, f in enumerate(fields):
            for key, arr in per_f.items():
                out[("per_field", f, key)] = arr[:, j]
        return out

    return fn


# the clause every rule of this kind starts with (tests/tasks/test_task_rules.py): an unanswered example never passes
ANSWERED = (
    "an example passes only when its output is a valid JSON object with every required field "
    "(hypothesis.required_fields) holding a value (not null or empty)"
)
_RULES = {
    "json_valid_rate": ("json_valid", f"{ANSWERED}"),
    "required_fields_rate": ("required_present", f"{ANSWERED}"),
    "intent_accuracy": ("intent_correct", f"{ANSWERED}, and its intent (as a set) equals the reference's"),
}


def _gated(score):
    """``score(rec)``, and 0.0 for an example that is not answered (:func:`answered`)."""
    return lambda r: float(score(r)) if (r.get("scores") or {}).get("answered") else 0.0


class Extraction(Task):
    name = "extraction"
    template = "extraction.yaml"
    reader = ReaderHints(
        label="data.fields.label: the category (e.g. the intent) used for stratified splits and per-class metrics",
        target="data.fields.target: a JSON object {intent, slots} (a string, or "
        "an object/mapping the reader serialises)",
        model_kinds=("causal-lm",),
    )
    headline = (
        "json_valid_rate",
        "required_fields_rate",
        "field_f1",
        "exact_match",
        "intent_accuracy",
        "intent_micro_f1",
        "intent_macro_f1",
    )
    summary = ("json_valid_rate", "required_fields_rate", "intent_accuracy", "field_f1", "exact_match")
    per_class_metric = "recall"

    def metric_names(self, cfg: TaskConfig) -> dict[str, list[str]]:
        return names(
            [
                "json_valid_rate",
                "required_fields_rate",
                "intent_accuracy",
                "exact_match",
                "field_precision",
                "field_recall",
                "field_f1",
                *MULTI_INTENT_METRICS,
            ],
            ["recall", "precision", "f1", "exact_match", "field_precision", "field_recall", "field_f1"],
            ["precision", "recall", "f1", "exact_match_rate"],
        )

    def score(self, records, cfg: TaskConfig):
        return score_extraction(records, cfg.required_fields, allow_fenced=cfg.eval.allow_fenced_json)

    def bootstrap_stats(self, base, cand, base_m, cand_m, cfg) -> BootstrapStats:
        classes = sorted(base_m["per_class"])
        intent_classes = sorted({lab for r in base for lab in (r["scores"]["ref_intent"] or [])})
        fields = sorted(set(base_m["per_field"]) | set(cand_m["per_field"]))
        keys = set(base_m)
        return BootstrapStats(
            _stats(base, classes, intent_classes, fields),
            _stats(cand, classes, intent_classes, fields),
            _metric_fn(classes, intent_classes, fields, keys),
            [r["scores"]["class"] for r in base],
        )

    def example_rule(self, metric: str | None) -> ExampleRule:
        """The per-example rule behind the paired counts of ``metric`` (exact match by default). Every
        rule fails an example whose output is not answered (:func:`answered`): not a valid JSON object,
        or a required field missing, null or empty."""
        if metric in _RULES:
            key, desc = _RULES[metric]
            return ExampleRule(key, desc, _gated(lambda r, k=key: bool(r["scores"][k])))
        if metric in ("field_f1", "field_precision", "field_recall"):
            return ExampleRule(
                "field_f1",
                f"{ANSWERED}, and its field F1 (slot/value pairs) is >= {PASS_F1:g}",
                _gated(lambda r: r["scores"]["field_f1"]),
                PASS_F1,
            )
        if metric in ("intent_micro_f1", "intent_macro_f1", "intent_precision", "intent_recall"):
            return ExampleRule(
                "intent_f1",
                f"{ANSWERED}, and the F1 of its intent labels is >= {PASS_F1:g}",
                _gated(lambda r: _intent_f1(r["scores"])),
                PASS_F1,
            )
        return ExampleRule(
            "correct",
            f"{ANSWERED}, and its whole object equals the reference (exact match)",
            _gated(lambda r: bool(r.get("correct"))),
        )

    def predicted_key(self, rec: dict) -> str | None:
        p = (rec.get("scores") or {}).get("pred_intent")
        return "|".join(p) if p else None

    def reference_key(self, rec: dict) -> str | None:
        p = (rec.get("scores") or {}).get("ref_intent")
        return "|".join(p) if p else None

    def failure_kind(self, rec: dict) -> str:
        sc = rec.get("scores") or {}
        if sc.get("parse_error"):
            return str(sc["parse_error"]).split(":", 1)[0].strip() or "not JSON"
        if sc.get("required_present") is False:
            return "required fields missing"
        if sc.get("has_intent", True) and sc.get("intent_correct") is False:
            return "wrong intent"
        if sc.get("fp") or sc.get("fn"):
            return "wrong or missing slot values"
        return "output differs from the reference"

    def audit(self, splits, cfg: TaskConfig) -> dict[str, Any]:
        labels = audit_labels(splits)
        targets = audit_targets([e for v in splits.values() for e in v], list(cfg.required_fields) or None)
        out = {
            "labels": labels,
            "targets": targets,
            "hard_faults": labels["hard_faults"] + targets["hard_faults"],
            "warnings": labels["warnings"] + targets["warnings"],
        }
        sets = {name: [json_list_field(e.target, "intent") for e in items] for name, items in splits.items()}
        if any(isinstance(s, list) for v in sets.values() for s in v):  # a list-valued intent: audit each label
            ls = audit_label_sets(
                sets, what="intent", sources={name: [e.source or e.id for e in items] for name, items in splits.items()}
            )
            out["label_sets"] = ls
            out["hard_faults"] += ls["hard_faults"]
            out["warnings"] += ls["warnings"]
        return out


def _intent_f1(s: dict) -> float:
    if not s.get("has_intent"):
        return 0.0
    return example_f1(s["intent_tp"], s["intent_fp"], s["intent_fn"], valid=s.get("pred_intent") is not None)


TASK = Extraction()
