"""What an evaluation prints on the screen: the per-class / per-field summary first (the worst
items with their numbers), then the averages, each with its name and how it is averaged.

Used by ``baseline``, ``eval`` and ``test`` (tests/evaluation/test_eval_screen.py), instead of only 'run r0002
completed'. Pure functions over the metrics dict a task's scorer returns; no I/O. Class and field names
are user text: each is one visible line (``tuneproof.ui.visible_text``); print the lines with ``user_text``.
"""

from __future__ import annotations

import math
from typing import Any

from tuneproof.ui import capped, visible_text

#: how many of the worst classes / fields the screen lists (the rest are in the run's eval.json)
WORST_N = 5

#: plain names of the headline metrics ("{present}" / "{total}": labels present / in the label set)
METRIC_NAMES = {
    "accuracy": "accuracy",
    "macro_f1": "macro-F1 (unweighted over {present} of {total} labels present)",
    "weighted_f1": "weighted-F1 (per-class F1 weighted by support)",
    "micro_f1": "micro-F1 (tp/fp/fn pooled over the labels)",
    "json_valid_rate": "strict JSON validity",
    "required_fields_rate": "required fields present",
    "field_f1": "field F1 (micro over slot/value pairs)",
    "exact_match": "whole-object exact match",
    "intent_accuracy": "intent accuracy",
    "intent_micro_f1": "intent micro-F1",
    "intent_macro_f1": "intent macro-F1 (unweighted over the intent labels present)",
    "exact_set_match": "exact label-set match",
    "compliance_rate": "format compliance",
    "schema_valid_rate": "JSON-schema validity",
    "regex_match_rate": "regex full match",
    "grammar_valid_rate": "grammar validity",
}


def fmt_p(p: float | None) -> str:
    """A p-value for people: scientific notation below 1e-3 (``3.7e-78``, never ``0.0000``),
    4 decimals otherwise (``0.0386``); a p-value that underflowed to 0 reads ``< 1e-300``."""
    if p is None or not isinstance(p, (int, float)) or math.isnan(p):
        return "-"
    if p == 0:
        return "< 1e-300"
    if p < 1e-3:
        mantissa, exp = f"{p:.1e}".split("e")
        return f"{mantissa}e{int(exp)}"
    return f"{p:.4f}"


def metric_short(key: str) -> str:
    """A metric's display name in tables and one-line summaries, from :data:`METRIC_NAMES` without its
    averaging note (``json_valid_rate`` -> ``strict JSON validity``, ``macro_f1`` -> ``macro-F1``);
    every screen and the dossier name a metric this way, the JSON files keep the key."""
    return METRIC_NAMES.get(key, key.replace("_", " ")).split(" (")[0]


def metric_name(key: str, metrics: dict[str, Any]) -> str:
    """The plain name of a headline metric, e.g. ``macro-F1 (unweighted over 15 of 17 labels present)``."""
    name = METRIC_NAMES.get(key, key.replace("_", " "))
    if "{present}" in name:
        labels = metrics.get("labels") or list(metrics.get("per_class") or {})
        present = metrics.get("labels_present")
        if present is None:
            present = sum(1 for v in (metrics.get("per_class") or {}).values() if (v.get("support") or 0) > 0)
        name = name.format(present=present, total=len(labels))
    return name


def _num(x: Any) -> str:
    return "-" if x is None else f"{x:.3f}" if isinstance(x, float) else str(x)


def worst_items(table: dict[str, dict], key: str, n: int = WORST_N) -> list[tuple[str, dict]]:
    """The ``n`` items (classes or fields) with the lowest ``key``, ties by name; items without
    support (0) are left out."""
    rows = [
        (name, v) for name, v in table.items() if isinstance(v.get(key), (int, float)) and (v.get("support") or 0) > 0
    ]
    return sorted(rows, key=lambda kv: (kv[1][key], kv[0]))[:n]


def _item_line(name: str, v: dict, keys: tuple[str, ...]) -> str:
    parts = [f"{k.replace('_', ' ')} {_num(v[k])}" for k in keys if k in v]
    return (
        f"  {visible_text(name, one_line=True)}: "
        + ", ".join(parts)
        + (f" (support {v['support']})" if "support" in v else "")
    )


def screen_lines(task: Any, metrics: dict[str, Any], *, worst: int = WORST_N) -> list[str]:
    """The lines an evaluation prints: the worst ``worst`` classes by the task's per-class metric
    and the worst fields by F1, each with its numbers and support, then every headline metric
    with its plain name.

    Example (classification, 77 labels)::

        worst 5 of 77 classes by recall:
          card_arrival: recall 0.000, precision 0.000, f1 0.000 (support 5)
          ...
        accuracy: 0.013
        macro-F1 (unweighted over 77 of 77 labels present): 0.004
    """
    lines: list[str] = []
    per_class = metrics.get("per_class") or {}
    key = getattr(task, "per_class_metric", "recall")
    if per_class and any(key in v for v in per_class.values()):
        rows = worst_items(per_class, key, worst)
        judged = sum(1 for v in per_class.values() if key in v and (v.get("support") or 0) > 0)
        at_min = sum(
            1 for v in per_class.values() if rows and v.get(key) == rows[0][1][key] and (v.get("support") or 0) > 0
        )
        ties = f" ({at_min} at {_num(float(rows[0][1][key]))})" if at_min > len(rows) else ""
        lines.append(f"worst {len(rows)} of {judged} classes by {key.replace('_', ' ')}{ties}:")
        keys = tuple(dict.fromkeys((key, "recall", "precision", "f1")))
        lines += [_item_line(name, v, keys) for name, v in rows]
    per_field = metrics.get("per_field") or {}
    if per_field and any("f1" in v for v in per_field.values()):
        rows = worst_items(per_field, "f1", worst)
        lines.append(f"worst {len(rows)} of {len(per_field)} fields by F1:")
        lines += [_item_line(name, v, ("f1", "precision", "recall")) for name, v in rows]
    heads = task.headline_for(metrics) if hasattr(task, "headline_for") else []
    for k in heads:
        v = metrics.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            lines.append(f"{metric_name(k, metrics)}: {_num(float(v))}")
    n_invalid = metrics.get("n_invalid")
    if n_invalid:
        lines.append(f"predictions outside the label set: {n_invalid} of {metrics.get('n')}")
    return lines


def reuse_line(reasons: list[str]) -> str:
    """``test`` on screen: whether this read of the test split is a reuse, and why."""
    if not reasons:
        return "test split: first use (not a reuse)"
    return "test split: REUSE - " + "; ".join(reasons) + " (the result no longer is a clean control)"


#: failing classes / fields a guard lists on screen (the full list is in compare.json)
MAX_FAILING_ON_SCREEN = 10


def guard_lines(v: dict, where: str = "compare.json") -> list[str]:
    """A verdict on screen: its detail, or for a per-class / per-field guard that fails, a short
    head line then one line per failing item with its numbers (at most :data:`MAX_FAILING_ON_SCREEN`,
    then ``... and N more (full list in compare.json)``)."""
    failing = [it for it in v.get("items") or [] if it.get("verdict") == "fail"]
    corr = correction_line(v)
    if not failing:
        return [v.get("detail", "")] + ([f"    {corr}"] if corr else [])
    what = "classes" if str(v.get("metric", "")).startswith("per_class") else "fields"
    judged = sum(1 for it in v["items"] if it.get("verdict") != "not measurable")
    sub = str(v.get("metric", "")).split("_", 2)[-1]
    out = [f"{len(failing)} of {judged} {what} fail (judged on support >= {v.get('min_support', 1)})"]
    for it in sorted(failing, key=lambda it: (math.inf if it.get("delta") is None else it["delta"], it["name"]))[
        :MAX_FAILING_ON_SCREEN
    ]:
        ci = it.get("ci") or [None, None]
        name = visible_text(it["name"], one_line=True)
        out.append(
            f"    {name}: {sub} {_num(it.get('base'))} -> {_num(it.get('cand'))}, delta {_num(it.get('delta'))} "
            f"[{_num(ci[0])}, {_num(ci[1])}], support {it.get('support')}"
            + (f", {paired_test_text(it)}" if "p_value" in it else "")
            + (f": {visible_text(it['why'], one_line=True)}" if it.get("why") else "")
        )
    if len(failing) > MAX_FAILING_ON_SCREEN:
        out.append(f"    ... and {len(failing) - MAX_FAILING_ON_SCREEN} more (full list in {where})")
    if corr:
        out.append(f"    {corr}")
    return out


def paired_test_text(item: dict) -> str:
    """A per-class item's paired test: ``McNemar p 0.0625 (5 broken, 0 fixed), Holm p 1.0000, BH q 1.0000``."""
    return (
        f"McNemar p {fmt_p(item.get('p_value'))} ({item.get('broken', 0)} broken, {item.get('fixed', 0)} fixed), "
        f"Holm p {fmt_p(item.get('p_holm'))}, BH q {fmt_p(item.get('q_bh'))}"
    )


def correction_line(v: dict) -> str:
    """Which multiplicity correction a per-class guard's verdict used, the uncorrected verdict beside it,
    and the classes Benjamini-Hochberg says moved; "" for a verdict without ``correction``."""
    c = v.get("correction")
    if not c:
        return ""
    n = c.get("family_size", 0)
    failing = [visible_text(x, one_line=True) for x in c.get("failing_uncorrected") or []]
    moved = [visible_text(x, one_line=True) for x in c.get("moved_bh") or []]
    used = (
        f"Holm over {n} classes ({c.get('test_short', 'exact McNemar per class')}, family-wise error "
        f"{c.get('alpha', 0.05):g})"
        if c.get("method") == "holm"
        else f"none (each class on its own 95% CI; {n} classes judged)"
    )
    unc = f"uncorrected: {c.get('verdict_uncorrected')}" + (
        f" ({len(failing)} failing: {capped(failing)})" if failing else ""
    )
    return (
        f"correction used by the verdict: {used}; {unc}; moved (Benjamini-Hochberg, FDR {c.get('alpha', 0.05):g}): "
        + (f"{len(moved)}: {capped(moved)}" if moved else "none")
    )
