"""Warnings a user needs before the rental hours, each stating its result also when it finds
nothing ("duplicates: none across train/validation/test"): silence would read as "not checked".

Pure functions over examples and encoded examples; the data check (``recipes/data_check.py``)
lists their ``line`` in its ``checks`` section and adds their warnings and hard faults.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from tuneproof.data.dedup import SPLIT_ORDER
from tuneproof.data.examples import Example, natural_key
from tuneproof.ui import capped

_LISTED = 10


def _ordered(names) -> list[str]:
    names = list(names)
    return [s for s in SPLIT_ORDER if s in names] + sorted(s for s in names if s not in SPLIT_ORDER)


def _listing(items: list[str], n: int = _LISTED) -> str:
    return capped(items, cap=n)


def small_classes(splits: dict[str, list[Example]], eval_split: str, threshold: int = 10) -> dict[str, Any]:
    """Classes with fewer than ``threshold`` examples (``data.min_class_examples``) in ``train``
    or in ``eval_split``; classes absent from a split are the label audit's (not counted here).

    Returns ``{"threshold", "small": {split: {label: count}}, "warnings": [...], "line": str}``;
    ``line`` is ``"classes under 10 examples: none in train/validation"`` when none is found,
    and ``None`` for data without labels.
    """
    names = [s for s in ("train", eval_split) if s in splits]
    small: dict[str, dict[str, int]] = {}
    warnings = []
    labelled = any(ex.label is not None for s in names for ex in splits[s])
    for s in names:
        counts = Counter(ex.label for ex in splits[s] if ex.label is not None)
        few = {lab: c for lab, c in sorted(counts.items(), key=lambda kv: (kv[1], kv[0])) if c < threshold}
        small[s] = few
        if few:
            warnings.append(
                f"{s}: {len(few)} of {len(counts)} classes have fewer than {threshold} examples: "
                + _listing([f"'{lab}' {c}" for lab, c in few.items()])
            )
    if not labelled:
        line = None
    elif warnings:
        line = "; ".join(warnings)
    else:
        line = f"classes under {threshold} examples: none in {'/'.join(names)}"
    return {"threshold": threshold, "small": small, "warnings": warnings, "line": line}


def cut_answers(encoded: dict[str, list], max_length: int) -> dict[str, Any]:
    """Answers cut by ``training.max_length`` (generative tasks), from the trainer's own encoding
    (:class:`~tuneproof.data.preprocess.Encoded` ``answer_lost`` / ``end_cut``).

    Returns ``{"count", "examples": [{"split", "id", "answer_tokens", "tokens_lost", "end_cut"}],
    "tokens_lost", "line"}``. A cut end token is a hard fault of the example itself (listed by
    the encoding faults); ``line`` states the count, ids and tokens lost, or ``"answers cut by
    max_length 128: none"``.
    """
    rows = [
        {"split": s, "id": e.id, "answer_tokens": e.answer_tokens, "tokens_lost": e.answer_lost, "end_cut": e.end_cut}
        for s in _ordered(encoded)
        for e in sorted(encoded[s], key=lambda e: natural_key(e.id))
        if getattr(e, "answer_lost", 0) > 0
    ]
    lost = sum(r["tokens_lost"] for r in rows)
    total = sum(len(v) for v in encoded.values())
    if rows:
        line = (
            f"answers cut by max_length {max_length}: {len(rows)} of {total} examples lose {lost} answer tokens, "
            f"{sum(r['end_cut'] for r in rows)} their end token: "
            + _listing([f"{r['split']}/{r['id']} (-{r['tokens_lost']})" for r in rows])
        )
    else:
        line = f"answers cut by max_length {max_length}: none"
    return {"count": len(rows), "examples": rows, "tokens_lost": lost, "line": line}


def cut_by_generation(
    encoded: list, split: str, max_new_tokens: int, end_token: bool = True, evaluated: set[str] | None = None
) -> dict[str, Any]:
    """Reference answers of the evaluation split longer than the generation budget ``eval.max_new_tokens``.

    An answer's length is counted in the tokens the model must generate for it, from the trainer's
    own encoding (:class:`~tuneproof.data.preprocess.Encoded` ``answer_tokens``: the answer as it
    follows the inference prompt, tokenised as the model produces it, with its end token, which is
    left out here when ``end_token``: the text is whole without it). A longer reference can never
    be produced whole: every metric on it is capped. ``evaluated``: the ids ``baseline``/``eval`` predict
    (the ``eval.max_examples`` subset); the line then also says how many of the cut ones are among them.

    Returns ``{"split", "max_new_tokens", "n", "count", "longest", "ids", "in_evaluated", "line"}``; ``line`` reads
    ``"answers longer than eval.max_new_tokens 64: 94 of 100 validation references (longest 180
    tokens; set eval.max_new_tokens to at least 180): ..."``, or ``"...: none of 100 validation
    references (longest 42 tokens)"``.
    """
    need = [(e.id, max(0, e.answer_tokens - (1 if end_token else 0))) for e in encoded]
    over = [(i, k) for i, k in need if k > max_new_tokens]
    longest = max((k for _, k in need), default=0)
    head = f"answers longer than eval.max_new_tokens {max_new_tokens}: "
    if over:
        line = (
            head + f"{len(over)} of {len(need)} {split} references (longest {longest} tokens; set eval.max_new_tokens "
            f"to at least {longest}, or the output metrics are capped): "
            + _listing([f"{i} ({k})" for i, k in sorted(over, key=lambda x: (-x[1], natural_key(x[0])))])
        )
        if evaluated is not None:
            line += f"; {sum(1 for i, _ in over if i in evaluated)} of them among the {len(evaluated)} evaluated"
    else:
        line = head + f"none of {len(need)} {split} references (longest {longest} token{'' if longest == 1 else 's'})"
    return {
        "split": split,
        "max_new_tokens": max_new_tokens,
        "n": len(need),
        "count": len(over),
        "longest": longest,
        "ids": [i for i, _ in over],
        "in_evaluated": None if evaluated is None else sum(1 for i, _ in over if i in evaluated),
        "line": line,
    }


def absent_optional(splits: dict[str, list[Example]], optional: list[str]) -> dict[str, Any]:
    """How many examples lack each ``data.fields.optional`` key (value null).

    Returns ``{"counts": {key: n}, "n": examples, "line"}``; ``line`` is None when no key is optional.
    """
    n = sum(len(v) for v in splits.values())
    counts = Counter(k for v in splits.values() for ex in v for k in ex.meta.get("absent", []))
    if not optional:
        return {"counts": {}, "n": n, "line": None}
    parts = [f"{k} absent in {counts.get(k, 0)} of {n}" for k in optional]
    return {
        "counts": {k: counts.get(k, 0) for k in optional},
        "n": n,
        "line": "optional keys (null when absent): " + ", ".join(parts),
    }


def duplicates_line(dedup_report) -> str:
    """``"duplicates: none across train/validation/test"`` when no pair of different splits
    collides, else the count of colliding examples per pair."""
    cross = [p for p in dedup_report.pairs.values() if p.first != p.second]
    names = _ordered(dedup_report.split_sizes)
    hits = [p for p in cross if p.counts["near"]["pairs"]]
    if not hits:
        return (
            f"duplicates: none across {'/'.join(names)}"
            if len(names) > 1
            else f"duplicates: only one split ({names[0]})"
        )
    return "duplicates across splits: " + ", ".join(
        f"{p.first}/{p.second} {p.counts['near']['second_colliding']} of {p.n_second}" for p in hits
    )


def fault_lines(hard_faults: list[str], encoding_faults: list[dict]) -> list[str]:
    """The data check's hard faults as printed: the encoding faults that share their text said once with the
    examples they hit (``validation/ex1, validation/ex2, ... and 25 more (27 examples): the supervised answer ...``),
    in the order each text first appears, after the other hard faults; a fault of one example reads as before
    (``validation/ex1: ...``). ``hard_faults``: the report's ``hard_faults``; ``encoding_faults``: its
    ``encoding_faults`` (``{"split", "id", "fault"}``)."""
    places: dict[str, list[str]] = {}
    for f in encoding_faults:
        places.setdefault(f["fault"], []).append(f"{f['split']}/{f['id']}")
    own = {f"{where}: {fault}" for fault, ws in places.items() for where in ws}
    out = [h for h in hard_faults if h not in own]
    for fault, ws in places.items():
        out.append(f"{ws[0]}: {fault}" if len(ws) == 1 else f"{_listing(ws, 3)} ({len(ws)} examples): {fault}")
    return out


def audit_lines(
    labels: dict[str, Any], targets: dict[str, Any] | None, faults: list[dict], lengths: dict[str, Any]
) -> list[str]:
    """One statement per audit of the data check, also when it finds nothing: classes missing
    from a split, texts with different labels (labelled data only), strict-JSON targets
    (generative tasks), encoding faults, examples longer than ``max_length``."""
    out = []
    if any(labels.get("class_counts", {}).values()):
        missing = labels.get("missing_classes", [])
        out.append(
            "classes missing from a split: none"
            if not missing
            else f"classes missing from a split: {len(missing)} ("
            + _listing([f"'{m['label']}' not in {', '.join(m['absent_from'])}" for m in missing], 5)
            + ")"
        )
        conflicts = labels.get("conflicting_labels", [])
        out.append(
            "texts with different labels: none" if not conflicts else f"texts with different labels: {len(conflicts)}"
        )
    if targets is not None:
        out.append(f"targets that are strict JSON: {targets['parsed']} of {targets['n']} ({targets['parse_rate']:.1%})")
    rank = {s: k for k, s in enumerate(_ordered({f["split"] for f in faults}))}
    bad = sorted({(f["split"], f["id"]) for f in faults}, key=lambda b: (rank[b[0]], natural_key(b[1])))
    out.append(
        "encoding faults (0 supervised tokens, end token, prompt prefix): none"
        if not bad
        else f"encoding faults: {len(bad)} examples (" + _listing([f"{s}/{i}" for s, i in bad], 5) + ")"
    )
    cut = {s: v for s, v in lengths.get("splits", {}).items() if v.get("truncated")}
    out.append(
        f"longer than max_length {lengths.get('max_length')}: "
        + ("none" if not cut else ", ".join(f"{s} {v['truncated']} of {v['n']}" for s, v in cut.items()))
    )
    return out
