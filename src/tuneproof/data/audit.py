"""Label and target audits of the examples (docs/PROTOCOL.md step 3), before any training.

Both functions return plain JSON-safe dicts with a ``hard_faults`` list (the data check refuses
to go on) and a ``warnings`` list (shown in the dossier), each a list of one-line strings.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from typing import Any

from tuneproof.data.dedup import SPLIT_ORDER, normalise
from tuneproof.data.examples import Example, natural_key
from tuneproof.data.invisible import remove_invisible
from tuneproof.errors import TuneproofError
from tuneproof.ui import capped

IMBALANCE_WARNING_RATIO = 10.0
_LISTED = 5  # examples named in one fault line before "and N more"


def _ordered(names) -> list[str]:
    names = list(names)
    return [s for s in SPLIT_ORDER if s in names] + sorted(s for s in names if s not in SPLIT_ORDER)


def _where(ex: Example) -> str:
    return ex.source or ex.id


def _listing(items: list[str]) -> str:
    return capped(items, cap=_LISTED)


def _is_empty(label: Any) -> bool:
    return label is None or (isinstance(label, str) and not label.strip())


def audit_labels(splits: dict[str, list[Example]], reserved: str | None = "test") -> dict[str, Any]:
    """Class balance and label consistency across splits.

    Returns a dict with keys:

    - ``class_counts``: ``{split: {label: count}}`` (labels sorted; empty labels not counted).
    - ``imbalance_ratio``: ``{split: max count / min count}`` over the classes present in that
      split (``None`` when it has no labelled example).
    - ``missing_classes``: ``[{"label", "present_in": [splits], "absent_from": [splits]}]``.
    - ``conflicting_labels``: ``[{"text": normalised text, "labels": [...], "examples":
      [{"id", "split", "label"}]}]``: the same text after :func:`~tuneproof.data.dedup.normalise`
      with different labels, inside or across splits.
    - ``empty_labels``: ids whose label is ``None`` or blank, when other examples have labels.
    - ``near_identical_labels``: groups of labels equal after case folding and whitespace collapsing
      (``['Sport ', 'sport']``), each a warning.
    - ``hard_faults`` / ``warnings``: one-line strings.

    Rules (tuneproof's own): hard faults are empty labels among labelled data, and a class of an
    evaluation split (any split but ``train``) that ``train`` never shows (the model cannot learn
    it), unless the class is only in ``reserved`` (the sealed test split, ``data.test_split``):
    nothing can be fixed there before training, so it is a warning naming the class and its rows.
    Warnings: a train class absent from an evaluation split (it is never measured),
    conflicting labels, and an imbalance ratio above 10. A study without any label (all ``None``)
    gives empty results and no fault.

    Raises:
        TuneproofError: ``splits`` is not a non-empty dict of example lists.
    """
    if not isinstance(splits, dict) or not splits:
        raise TuneproofError("audit_labels: splits must be a non-empty dict {split name: [Example, ...]}")
    names = _ordered(splits)
    hard: list[str] = []
    warn: list[str] = []
    labelled = any(not _is_empty(ex.label) for s in names for ex in splits[s])

    class_counts: dict[str, dict[str, int]] = {}
    imbalance: dict[str, float | None] = {}
    empty: list[str] = []
    for s in names:
        counts = Counter(str(ex.label) for ex in splits[s] if not _is_empty(ex.label))
        class_counts[s] = dict(sorted(counts.items()))
        imbalance[s] = max(counts.values()) / min(counts.values()) if counts else None
        if labelled:
            empty.extend(ex.id for ex in splits[s] if _is_empty(ex.label))
    if empty:
        hard.append(f"{len(empty)} example(s) have an empty label: {_listing(empty)}")

    missing: list[dict[str, Any]] = []
    all_labels = sorted({lab for c in class_counts.values() for lab in c})
    for lab in all_labels if labelled else []:
        present = [s for s in names if lab in class_counts[s]]
        absent = [s for s in names if lab not in class_counts[s]]
        if absent:
            missing.append({"label": lab, "present_in": present, "absent_from": absent})
            if "train" in absent:  # each of its rows named (count, the first 5 file:line), to fix them in one pass
                rows = [
                    ex.source or ex.id
                    for s in present
                    for ex in splits[s]
                    if not _is_empty(ex.label) and str(ex.label) == lab
                ]
                line = (
                    f"class '{lab}' is in {', '.join(present)} ({len(rows)} example{'s' if len(rows) != 1 else ''}: "
                    f"{_listing(rows)}) but never in train: the model cannot learn it"
                )
                # only in the reserved test split: nothing to fix before baseline/train (the split is sealed)
                if present == [reserved]:
                    warn.append(line + f"; its examples count against every candidate on the '{reserved}' split")
                else:
                    hard.append(line)
            else:
                warn.append(f"class '{lab}' is in train but not in {', '.join(absent)}: it is never measured there")

    for s in names:
        ratio = imbalance[s]
        if ratio is not None and ratio > IMBALANCE_WARNING_RATIO:
            counts = class_counts[s]
            big = max(counts, key=counts.get)
            small = min(counts, key=counts.get)
            warn.append(
                f"{s}: class imbalance {ratio:.1f}x ('{big}' {counts[big]} vs '{small}' {counts[small]}): "
                "report per-class recall, not only accuracy"
            )

    by_text: dict[str, list[tuple[str, Example]]] = defaultdict(list)
    for s in names:
        for ex in splits[s]:
            if not _is_empty(ex.label):
                by_text[normalise(ex.dedup_text())].append((s, ex))
    conflicts = []
    for text, members in by_text.items():
        labels = sorted({str(ex.label) for _, ex in members})
        if len(labels) > 1:
            conflicts.append(
                {
                    "text": text,
                    "labels": labels,
                    "examples": [{"id": ex.id, "split": s, "label": str(ex.label)} for s, ex in members],
                }
            )
    if conflicts:
        shown = [f"{c['examples'][0]['id']} ({' / '.join(c['labels'])})" for c in conflicts]
        warn.append(f"{len(conflicts)} text(s) appear with different labels: {_listing(shown)}")

    # labels that differ only in case, spaces or invisible characters ('sport', 'Sport ', 'sport\u200b'):
    # separate classes to the model
    variants: dict[str, list[str]] = defaultdict(list)
    for lab in all_labels:
        variants[" ".join(remove_invisible(lab).split()).casefold()].append(lab)
    near_labels = [sorted(v) for v in variants.values() if len(v) > 1]
    for group in near_labels:
        warn.append(
            f"labels {', '.join(repr(x) for x in group)} differ only in case, spaces or invisible characters: they are "
            f"{len(group)} separate "
            "classes to the model; fix the label column if they are one class"
        )

    return {
        "class_counts": class_counts,
        "near_identical_labels": near_labels,
        "imbalance_ratio": imbalance,
        "missing_classes": missing,
        "conflicting_labels": conflicts,
        "empty_labels": empty,
        "hard_faults": hard,
        "warnings": warn,
    }


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _strict_json(text: str) -> Any:
    """``json.loads`` without Python's extensions (NaN, Infinity, -Infinity are not JSON, RFC 8259)."""
    return json.loads(text, parse_constant=_reject_constant)


def audit_targets(
    examples: list[Example], required_fields: list[str] | tuple[str, ...] | None = ("intent", "slots")
) -> dict[str, Any]:
    """Strict-JSON validity and required top-level fields of extraction/format targets (docs/CASES.md C16).

    A target is valid when it parses as strict JSON (RFC 8259: double quotes, ``true`` not
    ``True``, no NaN/Infinity). ``required_fields`` are top-level keys every parsed target must
    have (docs/CONTRACTS.md default: ``["intent", "slots"]``); a parsed target that is not a JSON
    object misses all of them.

    Returns a dict with keys:

    - ``n``: examples audited; ``parsed``: targets that are strict JSON; ``parse_rate``:
      ``parsed / n`` (a fraction in [0, 1]; 1.0 when ``n`` is 0).
    - ``invalid``: ``[{"id", "source", "error"}]`` (source is the example's ``file:line``; error
      is the JSON error with its line/column inside the target, or "no target").
    - ``missing_fields``: ``[{"id", "source", "missing": [field, ...]}]``.
    - ``required_fields``: the fields checked.
    - ``hard_faults``: any invalid target (names the first sources and errors) and any missing
      required field; ``warnings``: empty for now (kept for the same shape as the other audits).

    Raises:
        TuneproofError: ``examples`` is not a list, or ``required_fields`` is not a list of strings.
    """
    if not isinstance(examples, (list, tuple)):
        raise TuneproofError(f"audit_targets: examples must be a list of Example, got {type(examples).__name__}")
    if required_fields is None:
        required_fields = []
    if isinstance(required_fields, str) or not all(isinstance(f, str) for f in required_fields):
        raise TuneproofError(f"audit_targets: required_fields must be a list of field names, got {required_fields!r}")
    required = list(required_fields)
    invalid: list[dict[str, str]] = []
    missing_fields: list[dict[str, Any]] = []
    parsed = 0
    for ex in examples:
        if ex.target is None:
            invalid.append({"id": ex.id, "source": _where(ex), "error": "no target"})
            continue
        try:
            value = _strict_json(ex.target)
        except json.JSONDecodeError as err:
            invalid.append(
                {"id": ex.id, "source": _where(ex), "error": f"line {err.lineno} column {err.colno}: {err.msg}"}
            )
            continue
        except ValueError as err:
            invalid.append({"id": ex.id, "source": _where(ex), "error": str(err)})
            continue
        parsed += 1
        absent = [f for f in required if not isinstance(value, dict) or f not in value]
        if absent:
            missing_fields.append({"id": ex.id, "source": _where(ex), "missing": absent})

    invalid.sort(key=lambda i: natural_key(i["source"]))  # by file, then numeric line
    missing_fields.sort(key=lambda m: natural_key(m["source"]))
    n = len(examples)
    rate = parsed / n if n else 1.0
    hard: list[str] = []
    if invalid:
        shown = [f"{i['source']} ({i['error']})" for i in invalid]
        hard.append(f"{len(invalid)} of {n} targets are not strict JSON (parse rate {rate:.1%}): {_listing(shown)}")
    if missing_fields:
        shown = [f"{m['source']} (missing {', '.join(m['missing'])})" for m in missing_fields]
        hard.append(f"{len(missing_fields)} of {parsed} parsed targets lack required fields: {_listing(shown)}")
    return {
        "n": n,
        "parsed": parsed,
        "parse_rate": rate,
        "required_fields": required,
        "invalid": invalid,
        "missing_fields": missing_fields,
        "hard_faults": hard,
        "warnings": [],
    }


def json_list_field(target: str | None, key: str) -> list | None:
    """``target[key]`` when the target is a JSON object whose ``key`` holds a list, else None."""
    if target is None:
        return None
    try:
        obj = _strict_json(target)
    except ValueError:
        return None
    value = obj.get(key) if isinstance(obj, dict) else None
    return value if isinstance(value, list) else None


def audit_label_sets(
    sets: dict[str, list[list[str] | None]],
    what: str = "label",
    sources: dict[str, list[str]] | None = None,
    reserved: str | None = "test",
) -> dict[str, Any]:
    """Per-label audit of a multi-label field (tests/tasks/test_task_data_check.py): support per label, label-set
    cardinality.

    Args:
        sets: ``{split: [labels of each example (a list; None when the example has none)]}``.
        what: the field's name in messages (``"label"``, ``"intent"``).
        sources: ``{split: [file:line of each example]}`` (parallel to ``sets``): a label train
            never shows then names its rows (count, the first 5, "and N more").

    Returns:
        ``{"support": {split: {label: examples holding it}}, "cardinality": {split: {"mean",
        "min", "max", "histogram": {size: examples}}}, "labels": sorted labels, "hard_faults",
        "warnings"}``. Hard fault: a label of an evaluation split that train never shows (the
        model cannot learn it); a warning instead when only ``reserved`` (the sealed test split)
        holds it. Warnings: a train label absent from an evaluation split (never
        measured there, its per-label guard reads "not measurable"), and examples with an empty
        label set.
    """
    names = _ordered(sets)
    support: dict[str, dict[str, int]] = {}
    card: dict[str, dict[str, Any]] = {}
    hard: list[str] = []
    warn: list[str] = []
    for s in names:
        c: Counter = Counter()
        sizes: Counter = Counter()
        for labs in sets[s]:
            uniq = sorted({str(x).strip() for x in labs or [] if str(x).strip()})
            c.update(uniq)
            sizes[len(uniq)] += 1
        support[s] = dict(sorted(c.items()))
        total = sum(sizes.values())
        card[s] = {
            "mean": (sum(k * v for k, v in sizes.items()) / total) if total else None,
            "min": min(sizes) if sizes else None,
            "max": max(sizes) if sizes else None,
            "histogram": {str(k): v for k, v in sorted(sizes.items())},
        }
        if sizes.get(0):
            warn.append(f"{s}: {sizes[0]} example(s) have an empty {what} set")
    labels = sorted({lab for c in support.values() for lab in c})
    train = support.get("train", {})
    for lab in labels:
        absent = [s for s in names if lab not in support[s]]
        present = [s for s in names if lab in support[s]]
        if "train" in support and lab not in train:
            rows = [
                src
                for sp in present
                for labs, src in zip(sets[sp], (sources or {}).get(sp, []))
                if lab in {str(x).strip() for x in labs or []}
            ]
            where = f" ({len(rows)} example{'s' if len(rows) != 1 else ''}: {_listing(rows)})" if rows else ""
            line = f"{what} '{lab}' is in {', '.join(present)}{where} but never in train: the model cannot learn it"
            if present == [reserved]:  # only in the sealed test split: a warning, nothing to fix before training
                warn.append(line + f"; its examples count against every candidate on the '{reserved}' split")
            else:
                hard.append(line)
        elif absent:
            warn.append(
                f"{what} '{lab}' is in train but not in {', '.join(absent)}: it is never measured there (support 0)"
            )
    return {"labels": labels, "support": support, "cardinality": card, "hard_faults": hard, "warnings": warn}


def audit_format_targets(examples: list[Example], rule: Any) -> dict[str, Any]:
    """Gold targets checked against the study's own format rule (tests/tasks/test_task_data_check.py).

    Args:
        examples: the examples whose ``target`` is the expected output.
        rule: a :class:`tuneproof.tasks.format.FormatRule` (``eval.json_schema``, ``eval.regex``,
            ``eval.grammar``, required fields); a target must pass it as a model output would
            (no code fence: data is not model output).

    Returns:
        ``{"rule": description, "n", "parsed", "parse_rate" (parsed / n, 1.0 when n is 0),
        "invalid": [{"id", "source", "error"}], "hard_faults", "warnings"}``. Any target that
        fails the rule is a hard fault naming the first ``file:line`` sources (the model is taught
        outputs its own metric calls wrong; an empty target is never compliant); when none passes the
        message says the rule matches none of the gold targets. A rule that accepts the empty answer
        (``rule.accepts_empty()``: ``eval.regex`` ``.*``, a schema ``{"type": "string"}``) is a warning.
    """
    invalid: list[dict[str, str]] = []
    for ex in examples:
        if ex.target is None:
            invalid.append({"id": ex.id, "source": _where(ex), "error": "no target"})
            continue
        res = rule.check(ex.target, fenced_ok=False)
        if not res["ok"]:
            invalid.append({"id": ex.id, "source": _where(ex), "error": res["error"]})
    invalid.sort(key=lambda i: natural_key(i["source"]))  # by file, then numeric line
    n = len(examples)
    parsed = n - len(invalid)
    rate = parsed / n if n else 1.0
    hard: list[str] = []
    if invalid:
        shown = [f"{i['source']} ({i['error']})" for i in invalid]
        if parsed == 0:
            hard.append(
                f"the format rule ({rule.describe()}) matches none of the {n} gold targets: {_listing(shown)}; "
                "fix eval.regex / eval.json_schema / eval.grammar"
            )
        else:
            hard.append(
                f"{len(invalid)} of {n} gold targets fail the format rule ("
                f"{rule.describe()}; parse rate {rate:.1%}): {_listing(shown)}"
            )
    warnings: list[str] = []
    empty = rule.accepts_empty()
    if empty:  # the rule says nothing about an empty answer: it would be "compliant" without the gate
        warnings.append(
            f"the format rule ({rule.describe()}) accepts the empty answer ({', '.join(empty)}): an empty or "
            "whitespace-only output is never counted compliant or fixed, but the rule does not say what an answer "
            "is; make eval.regex / eval.json_schema require one (e.g. '.+' instead of '.*', minLength: 1)"
        )
    return {
        "rule": rule.describe(),
        "n": n,
        "parsed": parsed,
        "parse_rate": rate,
        "invalid": invalid,
        "hard_faults": hard,
        "warnings": warnings,
    }
