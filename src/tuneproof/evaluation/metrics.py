"""Task metrics over per-example output records: classification, extraction, format.

Every scorer takes the per-example records of ``runs/<id>/outputs.jsonl`` (see
docs/CONTRACTS.md: ``id``, ``category``, ``reference``, ``prediction``) and returns
``(records, metrics)``: copies of the records with ``correct`` and ``scores`` filled in, and
one flat dict of metrics. Inputs are never modified. Every rate is a fraction in [0, 1].

Rules and where they come from:

- Classification metrics are scikit-learn's (``accuracy_score``,
  ``precision_recall_fscore_support``, ``confusion_matrix``) with ``zero_division=0`` and the
  label set passed explicitly, so a class the model never predicts scores 0 instead of
  vanishing from the average (CASES C15). A prediction outside the label set is wrong and is
  counted in an ``"<invalid>"`` column of the confusion matrix.
- Extraction targets are strict JSON ``{"intent": ..., "slots": {...}}`` (CONTRACTS.md);
  field precision/recall/F1 are micro-averaged over (slot, value) pairs, as in the slot-F1 of
  the SNIPS / ATIS literature, with values normalised by ``strip`` + ``casefold``.
- JSON validity is strict RFC 8259 via ``json.loads`` (no NaN/Infinity); output wrapped in a
  Markdown code fence is invalid unless ``eval.allow_fenced_json`` (CASES C16).
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections import Counter
from typing import Any, Iterable, Sequence

import numpy as np

from tuneproof.errors import TuneproofError

INVALID_LABEL = "<invalid>"
DEFAULT_EXTRACTION_FIELDS = ["intent", "slots"]
TASKS = ("classification", "extraction", "format")

# Headline metrics per task: the ones the paired comparison always reports with a CI.
HEADLINE_METRICS = {
    "classification": ["accuracy", "macro_f1"],
    "extraction": ["json_valid_rate", "required_fields_rate", "field_f1", "exact_match", "intent_accuracy"],
    "format": ["compliance_rate", "exact_match"],
}

#: Per-category / per-field metric names reported by the paired comparison (guards
#: ``per_class_<name>`` / ``per_field_<name>``), per task kind.
PER_CLASS_METRICS = {
    "classification": ["recall", "precision", "f1"],
    "extraction": ["recall", "precision", "f1", "exact_match", "field_precision", "field_recall", "field_f1"],
    "format": ["compliance_rate", "exact_match"],
}
PER_FIELD_METRICS = {"classification": [], "extraction": ["precision", "recall", "f1", "exact_match_rate"], "format": []}


def metric_names(task: str, *, required_fields: Sequence[str] | None = None, json_schema: Any = None,
                 regex: str | None = None) -> dict[str, list[str]]:
    """The metric names a comparison reports for ``task`` (what ``hypothesis.success.metric`` and
    ``hypothesis.guards[].metric`` may name).

    A format study reports ``json_valid_rate`` only with a JSON check (``eval.json_schema`` or
    ``hypothesis.required_fields``), ``schema_valid_rate`` only with ``eval.json_schema``,
    ``regex_match_rate`` only with ``eval.regex``, ``required_fields_rate`` only with required fields.

    Returns:
        ``{"aggregate": [...], "per_class": ["per_class_recall", ...], "per_field": [...]}``.

    Raises:
        TuneproofError: unknown task kind.
    """
    if task not in TASKS:
        raise TuneproofError(f"hypothesis.task: unknown task kind '{task}'", hint=f"use one of {', '.join(TASKS)}")
    if task == "classification":
        agg = ["accuracy", "macro_f1", "weighted_f1", "micro_f1"]
    elif task == "extraction":
        agg = ["json_valid_rate", "required_fields_rate", "intent_accuracy", "exact_match", "field_precision", "field_recall", "field_f1"]
    else:
        agg = ["compliance_rate", "exact_match"]
        if json_schema is not None or required_fields:
            agg.append("json_valid_rate")
        if json_schema is not None:
            agg.append("schema_valid_rate")
        if regex is not None:
            agg.append("regex_match_rate")
        if required_fields:
            agg.append("required_fields_rate")
    return {"aggregate": agg, "per_class": [f"per_class_{m}" for m in PER_CLASS_METRICS[task]],
            "per_field": [f"per_field_{m}" for m in PER_FIELD_METRICS[task]]}


_FENCE = re.compile(r"^```[A-Za-z0-9_+.-]*[ \t]*\r?\n(?P<body>.*?)\r?\n?[ \t]*```$", re.DOTALL)


# --------------------------------------------------------------------------- JSON parsing
def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_json_output(text: str | None, allow_fenced: bool = False) -> tuple[Any, str | None]:
    """Parse a model output (or a target) as strict JSON.

    The text is stripped of surrounding whitespace and parsed with ``json.loads``; ``NaN`` /
    ``Infinity`` are rejected (not JSON per RFC 8259). Python-literal style
    (``{'a': True}``) is invalid. Output wrapped in a Markdown code fence
    (```` ```json ... ``` ````) is invalid unless ``allow_fenced`` (CASES C16), in which case
    the fence is removed first.

    Args:
        text: the raw output; ``None`` counts as empty.
        allow_fenced: accept one surrounding code fence (study key ``eval.allow_fenced_json``).

    Returns:
        ``(obj, None)`` when valid (``obj`` may itself be ``None`` for the JSON ``null``), or
        ``(None, reason)``. ``reason`` starts with a kind followed by ``:``, one of
        ``empty``, ``code_fence``, ``python_literal``, ``not_json``, e.g.
        ``"python_literal: Expecting property name enclosed in double quotes at line 1 column 2
        (single quotes / True / None are Python, not JSON)"``.
    """
    s = (text or "").strip()
    if not s:
        return None, "empty: the output is empty"
    if s.startswith("```"):
        m = _FENCE.match(s)
        if not allow_fenced:
            return None, "code_fence: the output is wrapped in a ``` code fence (eval.allow_fenced_json is false)"
        if m is None:
            return None, "code_fence: unterminated or malformed ``` code fence"
        s = m.group("body").strip()
        if not s:
            return None, "empty: the code fence is empty"
    try:
        return json.loads(s, parse_constant=_reject_constant), None
    except json.JSONDecodeError as err:
        where = f"{err.msg} at line {err.lineno} column {err.colno}"
    except ValueError as err:  # NaN / Infinity
        return None, f"not_json: {err}"
    if len(s) <= 20_000:
        try:
            lit = ast.literal_eval(s)
        except Exception:  # noqa: BLE001 - any failure just means "not a Python literal either"
            lit = None
        if isinstance(lit, (dict, list, tuple)):
            return None, f"python_literal: {where} (single quotes / True / None are Python, not JSON)"
    return None, f"not_json: {where}"


def _reason_kind(reason: str | None) -> str | None:
    return None if reason is None else reason.split(":", 1)[0]


# --------------------------------------------------------------------------- helpers
def _ratio(num: float, den: float) -> float:
    """num / den with scikit-learn's ``zero_division=0`` convention."""
    return float(num) / float(den) if den else 0.0


def _f1(tp: float, fp: float, fn: float) -> float:
    """F1 = 2 tp / (2 tp + fp + fn), 0 when undefined (scikit-learn ``zero_division=0``)."""
    return _ratio(2 * tp, 2 * tp + fp + fn)


def _copy_records(records: Iterable[dict]) -> list[dict]:
    out = [dict(r) for r in records]
    if not out:
        raise TuneproofError("no examples to score: the output records are empty", hint="check the eval split and eval.max_examples")
    return out


def _rid(rec: dict, i: int) -> str:
    return str(rec.get("id", f"#{i}"))


def _text(value: Any) -> str:
    return "" if value is None else str(value)


# --------------------------------------------------------------------------- classification
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
        (``{label: {"recall", "precision", "f1", "support"}}``, recall first, as CASES C15
        asks), ``accuracy``, ``macro_f1``, ``weighted_f1``, ``micro_f1``, ``n_invalid``,
        ``invalid_rate``, ``confusion`` (``{"labels": rows, "columns": labels + ["<invalid>"],
        "matrix": [[int]]}``; rows are references, columns predictions), ``averaging``.

        Averaging follows scikit-learn (``precision_recall_fscore_support``, ``labels=`` the
        label set, ``zero_division=0``): macro = unweighted mean over labels, weighted = mean
        weighted by support, micro = from pooled tp/fp/fn over the labels (an ``<invalid>``
        prediction is a false negative and no false positive, so micro-F1 can exceed
        accuracy). CASES C15 (50 x class 0, 18 x class 1, always 0): accuracy 0.735,
        class-1 recall 0.0, macro-F1 0.4237.

    Raises:
        TuneproofError: no records, a missing reference, or a reference outside ``labels``.
    """
    from sklearn.metrics import accuracy_score, confusion_matrix, precision_recall_fscore_support

    recs = _copy_records(records)
    y_true = []
    for i, r in enumerate(recs):
        if r.get("reference") is None:
            raise TuneproofError(f"example {_rid(r, i)}: no reference label", hint="every evaluated example needs a label")
        y_true.append(_text(r["reference"]).strip())
    if labels is None:
        labels = sorted(set(y_true))
    labels = [str(lab) for lab in labels]
    label_set = set(labels)
    if INVALID_LABEL in label_set:
        raise TuneproofError(f"'{INVALID_LABEL}' is reserved and cannot be a label")
    unknown = sorted(set(y_true) - label_set)
    if unknown:
        raise TuneproofError(f"reference labels not in the label set: {unknown[:5]}", hint="pass the full label set")

    y_pred = []
    for r, ref in zip(recs, y_true):
        pred = _text(r.get("prediction")).strip()
        valid = pred in label_set
        y_pred.append(pred if valid else INVALID_LABEL)
        r["correct"] = bool(valid and pred == ref)
        r["scores"] = {"valid_label": valid}

    prec, rec, f1, sup = precision_recall_fscore_support(y_true, y_pred, labels=labels, average=None, zero_division=0)
    agg = {
        avg: precision_recall_fscore_support(y_true, y_pred, labels=labels, average=avg, zero_division=0)[2]
        for avg in ("macro", "weighted", "micro")
    }
    columns = labels + [INVALID_LABEL]
    cm = confusion_matrix(y_true, y_pred, labels=columns)[: len(labels)]
    n_invalid = sum(p == INVALID_LABEL for p in y_pred)
    n = len(recs)
    metrics = {
        "task": "classification",
        "n": n,
        "labels": labels,
        "per_class": {
            lab: {"recall": float(rec[k]), "precision": float(prec[k]), "f1": float(f1[k]), "support": int(sup[k])}
            for k, lab in enumerate(labels)
        },
        "accuracy": float(accuracy_score(y_true, y_pred)),
        "macro_f1": float(agg["macro"]),
        "weighted_f1": float(agg["weighted"]),
        "micro_f1": float(agg["micro"]),
        "n_invalid": int(n_invalid),
        "invalid_rate": n_invalid / n,
        "confusion": {"labels": labels, "columns": columns, "matrix": cm.astype(int).tolist()},
        "averaging": {
            "accuracy": "share of examples whose prediction equals the reference (sklearn accuracy_score)",
            "macro_f1": f"unweighted mean of per-class F1 over the {len(labels)} labels (sklearn average='macro', zero_division=0)",
            "weighted_f1": "mean of per-class F1 weighted by reference support (sklearn average='weighted')",
            "micro_f1": "F1 of tp/fp/fn pooled over the labels (sklearn average='micro'); <invalid> predictions are false negatives only",
            "per_class": "one-vs-rest precision, recall, F1 per label (sklearn average=None, zero_division=0)",
        },
    }
    return recs, metrics


# --------------------------------------------------------------------------- extraction
def _norm_value(v: Any) -> str:
    if isinstance(v, str):
        return v.strip().casefold()
    if isinstance(v, (dict, list)):
        return json.dumps(v, sort_keys=True, ensure_ascii=False).casefold()
    return json.dumps(v).casefold()  # numbers, booleans, null: their JSON text


def _slot_pairs(slots: Any) -> Counter:
    """Multiset of normalised (slot, value) pairs; a list value gives one pair per element."""
    pairs: Counter = Counter()
    if not isinstance(slots, dict):
        return pairs
    for name, value in slots.items():
        values = value if isinstance(value, list) else [value]
        for v in values:
            pairs[(str(name), _norm_value(v))] += 1
    return pairs


def _intent(obj: Any) -> str | None:
    if isinstance(obj, dict) and isinstance(obj.get("intent"), str):
        return obj["intent"].strip()
    return None


def _canonical(obj: dict) -> dict:
    """Object with slot values normalised (strip + casefold, order-free) for exact match."""
    out = {}
    for k, v in obj.items():
        if k == "slots":
            out[k] = sorted(_slot_pairs(v).elements()) if isinstance(v, dict) else v
        elif k == "intent" and isinstance(v, str):
            out[k] = v.strip()
        else:
            out[k] = v
    return out


def score_extraction(
    records: Sequence[dict], required_fields: Sequence[str] | None = None, allow_fenced: bool = False
) -> tuple[list[dict], dict]:
    """Score structured extraction outputs ``{"intent": str, "slots": {slot: value | [values]}}``.

    Args:
        records: dicts with ``reference`` and ``prediction`` (JSON strings), ``id``, ``category``.
        required_fields: top-level keys every output must have; empty/None means
            ``["intent", "slots"]`` (CONTRACTS.md).
        allow_fenced: accept a ``` fenced prediction (``eval.allow_fenced_json``).

    Per example, ``scores`` holds ``json_valid`` (strict parse), ``parse_error`` (reason or
    None), ``required_present``, ``intent_correct``, ``tp`` / ``fp`` / ``fn`` (counts of
    (slot, value) pairs), ``ref_intent``, ``pred_intent``, ``class`` (the reference intent,
    else the record's category, else ``"<none>"``) and ``fields`` (``{slot: [tp, fp, fn]}``); ``correct`` = exact match: valid object equal to the reference after slot values
    are normalised (strip + casefold; the order of values of a repeated slot is ignored;
    ``"x"`` equals ``["x"]``). An invalid or non-object prediction predicts 0 pairs, so all
    its reference pairs are false negatives.

    Returns:
        ``(records, metrics)`` with keys ``task``, ``n``, ``required_fields``,
        ``json_valid_rate``, ``required_fields_rate``, ``intent_accuracy``, ``exact_match``,
        ``field_precision``, ``field_recall``, ``field_f1`` (micro over pairs), ``tp``, ``fp``,
        ``fn``, ``parse_errors`` (``{kind: count}``), ``per_class`` (per ``class``, i.e. reference intent:
        ``{"support", "recall", "precision", "f1", "exact_match", "field_precision",
        "field_recall", "field_f1"}``; recall/precision/F1 are of the intent label),
        ``per_field`` (slots seen in references: ``{"precision", "recall", "f1", "support",
        "exact_match_rate"}``; support = reference pairs, exact_match_rate = share of examples
        whose reference has the slot where the predicted values equal the reference values),
        ``unknown_predicted_fields`` (``{slot: false positives}`` for slots no reference has),
        ``averaging``.

    Raises:
        TuneproofError: no records, or a reference that is not strict JSON (names the id).
    """
    recs = _copy_records(records)
    required = list(required_fields or DEFAULT_EXTRACTION_FIELDS)
    n = len(recs)
    totals = Counter()
    parse_errors: Counter = Counter()
    per_field_counts: dict[str, Counter] = {}
    class_stats: dict[str, Counter] = {}
    pred_intent_counts: Counter = Counter()

    for i, r in enumerate(recs):
        ref, ref_err = parse_json_output(_text(r.get("reference")), allow_fenced=False)
        if ref_err is not None or not isinstance(ref, dict):
            raise TuneproofError(
                f"example {_rid(r, i)}: the reference is not a strict JSON object ({ref_err or type(ref).__name__})",
                hint="run `tuneproof data check`: every extraction target must be strict JSON",
            )
        pred, err = parse_json_output(_text(r.get("prediction")), allow_fenced=allow_fenced)
        valid = err is None
        is_obj = valid and isinstance(pred, dict)
        if not valid:
            parse_errors[_reason_kind(err)] += 1
        elif not is_obj:
            parse_errors["not_object"] += 1
        required_present = bool(is_obj and all(k in pred for k in required))
        ref_pairs = _slot_pairs(ref.get("slots"))
        pred_pairs = _slot_pairs(pred.get("slots")) if is_obj else Counter()
        tp_pairs = ref_pairs & pred_pairs
        tp, fp, fn = sum(tp_pairs.values()), sum((pred_pairs - ref_pairs).values()), sum((ref_pairs - pred_pairs).values())
        ref_intent = _intent(ref)
        pred_intent = _intent(pred) if is_obj else None
        intent_correct = bool(is_obj and pred_intent == ref_intent)  # both None: a target without intent
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
            pc["tp"] += ftp
            pc["fp"] += ffp
            pc["fn"] += ffn
            if slot in ref_slots:
                pc["support"] += ftp + ffn
                pc["examples"] += 1
                pc["exact"] += int(ffp == 0 and ffn == 0)

        cls = ref_intent if ref_intent is not None else _text(r.get("category")) or "<none>"
        cs = class_stats.setdefault(cls, Counter())
        cs["support"] += 1
        cs["intent_tp"] += int(intent_correct)
        cs["exact"] += int(exact)
        cs["tp"] += tp
        cs["fp"] += fp
        cs["fn"] += fn
        if pred_intent is not None:
            pred_intent_counts[pred_intent] += 1

        totals.update(valid=int(valid), required=int(required_present), intent=int(intent_correct), exact=int(exact), tp=tp, fp=fp, fn=fn)
        r["correct"] = exact
        r["scores"] = {
            "json_valid": valid,
            "parse_error": err if not valid else (None if is_obj else "not_object: the JSON is not an object"),
            "required_present": required_present,
            "intent_correct": intent_correct,
            "tp": tp,
            "fp": fp,
            "fn": fn,
            "ref_intent": ref_intent,
            "pred_intent": pred_intent,
            "class": cls,
            "fields": fields,
        }

    tp, fp, fn = totals["tp"], totals["fp"], totals["fn"]
    per_class = {}
    for cls in sorted(class_stats):
        cs = class_stats[cls]
        intent_fp = pred_intent_counts[cls] - cs["intent_tp"]
        per_class[cls] = {
            "support": cs["support"],
            "recall": _ratio(cs["intent_tp"], cs["support"]),
            "precision": _ratio(cs["intent_tp"], pred_intent_counts[cls]),
            "f1": _f1(cs["intent_tp"], intent_fp, cs["support"] - cs["intent_tp"]),
            "exact_match": _ratio(cs["exact"], cs["support"]),
            "field_precision": _ratio(cs["tp"], cs["tp"] + cs["fp"]),
            "field_recall": _ratio(cs["tp"], cs["tp"] + cs["fn"]),
            "field_f1": _f1(cs["tp"], cs["fp"], cs["fn"]),
        }
    per_field, unknown = {}, {}
    for slot in sorted(per_field_counts):
        pc = per_field_counts[slot]
        if pc["support"] == 0:
            unknown[slot] = pc["fp"]
            continue
        per_field[slot] = {
            "precision": _ratio(pc["tp"], pc["tp"] + pc["fp"]),
            "recall": _ratio(pc["tp"], pc["tp"] + pc["fn"]),
            "f1": _f1(pc["tp"], pc["fp"], pc["fn"]),
            "support": pc["support"],
            "exact_match_rate": _ratio(pc["exact"], pc["examples"]),
        }
    metrics = {
        "task": "extraction",
        "n": n,
        "required_fields": required,
        "json_valid_rate": totals["valid"] / n,
        "required_fields_rate": totals["required"] / n,
        "intent_accuracy": totals["intent"] / n,
        "exact_match": totals["exact"] / n,
        "field_precision": _ratio(tp, tp + fp),
        "field_recall": _ratio(tp, tp + fn),
        "field_f1": _f1(tp, fp, fn),
        "tp": tp,
        "fp": fp,
        "fn": fn,
        "parse_errors": dict(sorted(parse_errors.items())),
        "per_class": per_class,
        "per_field": per_field,
        "unknown_predicted_fields": unknown,
        "averaging": {
            "field_f1": "micro: F1 of (slot, value) pairs pooled over all examples; values stripped and casefolded",
            "exact_match": "share of examples whose whole object equals the reference after value normalisation",
            "per_class": "per reference intent; recall/precision/f1 are of the intent label (one-vs-rest)",
            "per_field": "per slot name, pairs pooled over examples",
        },
    }
    return recs, metrics


# --------------------------------------------------------------------------- format
def score_format(
    records: Sequence[dict],
    json_schema: dict | None = None,
    regex: str | None = None,
    allow_fenced: bool = False,
    required_fields: Sequence[str] | None = None,
) -> tuple[list[dict], dict]:
    """Score format compliance: JSON Schema validity and/or a full regex match, plus exact match.

    Args:
        records: dicts with ``reference``, ``prediction``, ``id``, ``category``.
        json_schema: a JSON Schema every output must satisfy (``jsonschema``, the draft named by
            ``$schema``, default the latest); the output is first parsed as strict JSON.
        regex: a regular expression the stripped output must match entirely (``re.fullmatch``).
        allow_fenced: accept a ``` fenced JSON output.
        required_fields: top-level keys a JSON output must have.

    Per example ``correct`` = compliant with every configured check; ``scores`` holds
    ``compliant``, ``exact``, and per check ``json_valid`` / ``parse_error``,
    ``schema_valid`` / ``schema_error``, ``regex_match``, ``required_present``.
    ``exact`` compares parsed JSON objects when a JSON check is configured and the reference
    parses, else the stripped strings.

    Returns:
        ``(records, metrics)`` with ``task``, ``n``, ``checks``, ``compliance_rate``,
        ``exact_match``, and per configured check ``json_valid_rate``, ``schema_valid_rate``,
        ``regex_match_rate``, ``required_fields_rate``; ``per_class`` per record ``category``
        (``{"support", "compliance_rate", "exact_match"}``; records without category skipped).

    Raises:
        TuneproofError: no check configured, an invalid JSON Schema (``eval.json_schema``) or
            regex (``eval.regex``), or no records.
    """
    recs = _copy_records(records)
    required = list(required_fields or [])
    json_mode = json_schema is not None or bool(required)
    if json_schema is None and regex is None and not required:
        raise TuneproofError(
            "a format study needs a check: none of eval.json_schema, eval.regex, hypothesis.required_fields is set",
            hint="set eval.json_schema or eval.regex in the study file",
        )
    validator = None
    if json_schema is not None:
        import jsonschema

        try:
            cls = jsonschema.validators.validator_for(json_schema)
            cls.check_schema(json_schema)
        except jsonschema.SchemaError as err:
            raise TuneproofError(f"eval.json_schema: not a valid JSON Schema ({err.message})") from None
        validator = cls(json_schema)
    pattern = None
    if regex is not None:
        try:
            pattern = re.compile(regex)
        except re.error as err:
            raise TuneproofError(f"eval.regex: not a valid regular expression ({err})") from None

    checks = (["json_schema"] if validator else []) + (["regex"] if pattern else []) + (["required_fields"] if required else [])
    counts = Counter()
    per_class: dict[str, Counter] = {}
    for r in recs:
        pred_text = _text(r.get("prediction"))
        ref_text = _text(r.get("reference"))
        sc: dict[str, Any] = {}
        ok = True
        pred_obj = None
        if json_mode:
            pred_obj, err = parse_json_output(pred_text, allow_fenced=allow_fenced)
            sc["json_valid"], sc["parse_error"] = err is None, err
            counts["json_valid"] += err is None
            if validator is not None:
                errors = [] if err is not None else sorted(validator.iter_errors(pred_obj), key=lambda e: list(e.path))
                sc["schema_valid"] = err is None and not errors
                sc["schema_error"] = err if err is not None else (errors[0].message if errors else None)
                counts["schema_valid"] += sc["schema_valid"]
                ok &= sc["schema_valid"]
            if required:
                sc["required_present"] = err is None and isinstance(pred_obj, dict) and all(k in pred_obj for k in required)
                counts["required"] += sc["required_present"]
                ok &= sc["required_present"]
            ok &= err is None
        if pattern is not None:
            sc["regex_match"] = pattern.fullmatch(pred_text.strip()) is not None
            counts["regex"] += sc["regex_match"]
            ok &= sc["regex_match"]
        exact = pred_text.strip() == ref_text.strip()
        if json_mode:
            ref_obj, ref_err = parse_json_output(ref_text)
            if ref_err is None:
                exact = sc["json_valid"] and pred_obj == ref_obj
        sc["compliant"], sc["exact"] = bool(ok), bool(exact)
        counts["compliant"] += bool(ok)
        counts["exact"] += bool(exact)
        r["correct"] = bool(ok)
        r["scores"] = sc
        if r.get("category") is not None:
            pc = per_class.setdefault(str(r["category"]), Counter())
            pc.update(support=1, compliant=int(ok), exact=int(exact))

    n = len(recs)
    metrics: dict[str, Any] = {"task": "format", "n": n, "checks": checks, "compliance_rate": counts["compliant"] / n, "exact_match": counts["exact"] / n}
    if json_mode:
        metrics["json_valid_rate"] = counts["json_valid"] / n
    if validator is not None:
        metrics["schema_valid_rate"] = counts["schema_valid"] / n
    if pattern is not None:
        metrics["regex_match_rate"] = counts["regex"] / n
    if required:
        metrics["required_fields_rate"] = counts["required"] / n
    metrics["per_class"] = {
        c: {"support": pc["support"], "compliance_rate": _ratio(pc["compliant"], pc["support"]), "exact_match": _ratio(pc["exact"], pc["support"])}
        for c, pc in sorted(per_class.items())
    }
    return recs, metrics


# --------------------------------------------------------------------------- dispatch
def _as_eval(eval_cfg: Any):
    from tuneproof.study import Eval

    if eval_cfg is None:
        return Eval()
    if isinstance(eval_cfg, dict):
        return Eval.model_validate(eval_cfg)
    return eval_cfg


def score(
    task: str,
    records: Sequence[dict],
    *,
    required_fields: Sequence[str] | None = None,
    eval_cfg: Any = None,
    labels: Sequence[str] | None = None,
) -> tuple[list[dict], dict]:
    """Score records for a task kind: ``"classification"``, ``"extraction"`` or ``"format"``.

    ``eval_cfg`` is the study's :class:`tuneproof.study.Eval` (or a dict of it, or None for
    defaults); it supplies ``allow_fenced_json``, ``json_schema`` and ``regex``. ``labels``
    only applies to classification. See the task scorers for the metric keys.

    Raises:
        TuneproofError: unknown task, or anything the task scorer raises.
    """
    cfg = _as_eval(eval_cfg)
    if task == "classification":
        return score_classification(records, labels=labels)
    if task == "extraction":
        return score_extraction(records, required_fields, allow_fenced=cfg.allow_fenced_json)
    if task == "format":
        return score_format(records, json_schema=cfg.json_schema, regex=cfg.regex, allow_fenced=cfg.allow_fenced_json, required_fields=required_fields)
    raise TuneproofError(f"hypothesis.task: unknown task kind '{task}'", hint=f"use one of {', '.join(TASKS)}")


# --------------------------------------------------------------------------- data check
def check_targets_json(examples: Iterable[Any], required_fields: Sequence[str] | None = None) -> dict:
    """Strict JSON parse rate of example targets (CASES C16), for the data check.

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


def finite_or_none(x: Any) -> Any:
    """A float for JSON artifacts: NaN / inf become None."""
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else None
    return x
