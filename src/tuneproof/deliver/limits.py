"""The observed limits of a trained model (docs/PROTOCOL.md step 7: the limits that were observed).

From the evidence already recorded, never from a new run:

- ``regressed``: classes or fields whose metric went down against the baseline (per-class recall,
  per-field F1 ...), with the paired bootstrap interval; ``significant`` when the whole 95%
  interval is below 0;
- ``weak``: classes or fields whose candidate value stays below :data:`WEAK_BELOW`;
- ``failures``: the typical failures of the candidate on the evaluation split, grouped by kind
  (classification: "<true> predicted as <pred>"; extraction/format: the parse error kind, wrong
  intent, missing required fields, wrong slot values ...), each with its count and example ids;
- ``broken``: ids that the baseline got right and the candidate gets wrong;
- ``test_set``: every read of the reserved test split, and whether it was reused (read more than
  once, or for more than one candidate: its value as an independent control is worn).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from tuneproof.tasks import TASKS
from tuneproof.ui import capped, capped_items

WEAK_BELOW = 0.5  # a class/field whose candidate value is below this is listed as weak
MAX_IDS = 5  # example ids kept per failure kind

PER_FIELD_METRIC = "f1"


def per_class_metric(task: str) -> str:
    """The metric per category used for "regressed" and "weak" (the task kind's own)."""
    kind = TASKS.get(task)
    return kind.per_class_metric if kind is not None else "recall"


def failure_kind(task: str, rec: dict[str, Any]) -> str:
    """A short name for why an output record (``outputs.jsonl`` row) is wrong (the task kind decides)."""
    kind = TASKS.get(task)
    return kind.failure_kind(rec) if kind is not None else "output differs from the reference"


def typical_failures(task: str, outputs: list[dict[str, Any]], top: int = 8) -> list[dict[str, Any]]:
    """The ``top`` most frequent failure kinds: ``[{"kind", "count", "share", "example_ids"}]``
    (share of all evaluated examples; ids in file order, at most :data:`MAX_IDS`)."""
    groups: dict[str, list[str]] = defaultdict(list)
    for r in outputs:
        if not r.get("correct"):
            groups[failure_kind(task, r)].append(str(r.get("id")))
    n = max(1, len(outputs))
    ranked = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))[:top]
    return [{"kind": k, "count": len(v), "share": len(v) / n, "example_ids": v[:MAX_IDS]} for k, v in ranked]


def _deltas(section: dict[str, Any], kind: str, metric: str) -> tuple[list[dict], list[dict]]:
    regressed, weak = [], []
    for name, metrics in sorted(section.items()):
        m = metrics.get(metric) if isinstance(metrics, dict) else None
        if not isinstance(m, dict):
            continue
        if m.get("support") == 0:  # not in the evaluated split: not measurable, neither weak nor regressed
            continue
        base, cand, delta, ci = m.get("base"), m.get("cand"), m.get("delta"), m.get("ci")
        row = {
            "kind": kind,
            "name": name,
            "metric": metric,
            "base": base,
            "cand": cand,
            "delta": delta,
            "ci": ci,
            "support": m.get("support"),
        }
        if isinstance(delta, (int, float)) and delta < 0:
            regressed.append({**row, "significant": bool(ci and ci[1] is not None and ci[1] < 0)})
        if isinstance(cand, (int, float)) and cand < WEAK_BELOW:
            weak.append(row)
    return regressed, weak


def _weak_from_metrics(metrics: dict[str, Any], task: str) -> list[dict]:
    """Weak classes/fields from an eval's metrics alone (no comparison with a baseline)."""
    out = []
    cm = per_class_metric(task)
    for name, v in sorted((metrics.get("per_class") or {}).items()):
        if isinstance(v, dict) and v.get("support") != 0 and isinstance(v.get(cm), (int, float)) and v[cm] < WEAK_BELOW:
            out.append(
                {
                    "kind": "class",
                    "name": name,
                    "metric": cm,
                    "base": None,
                    "cand": v[cm],
                    "delta": None,
                    "ci": None,
                    "support": v.get("support"),
                }
            )
    for name, v in sorted((metrics.get("per_field") or {}).items()):
        if (
            isinstance(v, dict)
            and isinstance(v.get(PER_FIELD_METRIC), (int, float))
            and v[PER_FIELD_METRIC] < WEAK_BELOW
        ):
            out.append(
                {
                    "kind": "field",
                    "name": name,
                    "metric": PER_FIELD_METRIC,
                    "base": None,
                    "cand": v[PER_FIELD_METRIC],
                    "delta": None,
                    "ci": None,
                    "support": v.get("support"),
                }
            )
    return out


def reserved_split_use(accesses: list[dict[str, Any]]) -> dict[str, Any]:
    """Summary of the reserved test split's access log (``Registry.test_accesses()``)."""
    cands = Counter(a["candidate"] for a in accesses)
    reused = len(accesses) > 1
    if not accesses:
        note = "the reserved test split has not been read: the results above are on the evaluation split only"
    elif reused:
        note = (
            f"the test split was read {len(accesses)} times for {len(cands)} candidate(s): choosing among them on it "
            "wears out its value as an independent control"
        )
    else:
        note = "the test split was read once"
    return {"reads": len(accesses), "candidates": dict(cands), "reused": reused, "note": note}


def observed_limits(
    task: str,
    *,
    eval_metrics: dict[str, Any] | None,
    outputs: list[dict[str, Any]],
    comparison: dict[str, Any] | None,
    test_accesses: list[dict[str, Any]],
    forced: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Collect the limits (see the module docstring).

    Args:
        eval_metrics: the candidate eval run's metrics (``eval.json`` ``metrics``), or None.
        outputs: the candidate eval run's ``outputs.jsonl`` rows (may be empty).
        comparison: the candidate's entry of ``compare.json`` ``candidates`` (paired with the baseline), or None.
        forced: ``{"status", "reason"}`` when a failed/invalid run was exported with ``--force``.

    Returns ``{"regressed", "weak", "failures", "broken", "test_set", "notes"}``.
    """
    regressed: list[dict] = []
    weak: list[dict] = []
    notes: list[str] = []
    if comparison:
        r1, w1 = _deltas(comparison.get("per_class") or {}, "class", per_class_metric(task))
        r2, w2 = _deltas(comparison.get("per_field") or {}, "field", PER_FIELD_METRIC)
        regressed, weak = r1 + r2, w1 + w2
        if (comparison.get("concentration") or {}).get("flagged"):
            notes.append(f"gain concentrated: {comparison['concentration'].get('detail')}")
        notes += list(comparison.get("notes") or [])
    elif eval_metrics:
        weak = _weak_from_metrics(eval_metrics, task)
        notes.append("no comparison with the baseline was run: regressions cannot be judged")
    else:
        notes.append("no evaluation of this run: nothing is known of its quality")
    if forced:
        notes.append(
            f"exported with --force although the run is {forced.get('status')}"
            + (f" ({forced.get('reason')})" if forced.get("reason") else "")
        )
    return {
        "weak_below": WEAK_BELOW,
        "regressed": sorted(regressed, key=lambda r: r["delta"]),
        "weak": sorted(weak, key=lambda r: r["cand"]),
        "failures": typical_failures(task, outputs),
        "broken": list((comparison or {}).get("broken_ids") or [])[:20],
        "test_set": reserved_split_use(test_accesses),
        "notes": notes,
    }


def limits_lines(limits: dict[str, Any], max_rows: int = 8) -> list[str]:
    """The limits as plain sentences (model card, dossier, terminal)."""
    out = []
    regressed = []
    for r in limits.get("regressed", []):
        ci = r.get("ci")
        ci_s = f", 95% CI [{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci and None not in ci else ""
        regressed.append(
            f"regressed: {r['kind']} {r['name']}: {r['metric']} {r['base']:.3f} -> {r['cand']:.3f} "
            f"({r['delta']:+.3f}{ci_s}{', significant' if r.get('significant') else ''})"
        )
    out += _more(capped_items(regressed, cap=max_rows), "regressed")
    weak = [
        f"weak: {r['kind']} {r['name']}: {r['metric']} {r['cand']:.3f} "
        f"(below {limits.get('weak_below', WEAK_BELOW)}"
        + (f", support {r['support']}" if r.get("support") is not None else "")
        + ")"
        for r in limits.get("weak", [])
    ]
    out += _more(capped_items(weak, cap=max_rows), "weak")
    for f in limits.get("failures", [])[:max_rows]:
        out.append(
            f"typical failure: {f['kind']}: {f['count']} example(s) ("
            f"{f['share']:.0%}), e.g. {capped(f['example_ids'], cap=3)}"
        )
    if limits.get("broken"):
        out.append(f"right before, wrong after fine-tuning: {capped(limits['broken'])}")
    ts = limits.get("test_set") or {}
    if ts.get("note"):
        out.append(f"test set: {ts['note']}")
    out += [f"note: {n}" for n in limits.get("notes", [])]
    return out


def _more(lines: list[str], what: str) -> list[str]:
    """The capped lines of one kind, their "and N more" entry named after the kind."""
    if lines and lines[-1].startswith("and "):
        lines[-1] = f"{what}: {lines[-1]}"
    return lines


#: limits the dossier's first screen names (the whole list is in its section Limits observed)
FIRST_SCREEN_LIMITS = 5


def summary_limits(limits: dict[str, Any], n: int = FIRST_SCREEN_LIMITS) -> list[str]:
    """At most ``n`` short lines, one per kind of limit, the most serious first: regressions (how
    many, how many significant, the worst), weak classes or fields (names capped), the most
    frequent failure, the examples broken by fine-tuning, the test split's use, then the notes.
    The dossier's first screen (tests/deliver/test_deliver_limits.py)."""
    out: list[str] = []
    reg = limits.get("regressed") or []
    if reg:
        sig = sum(1 for r in reg if r.get("significant"))
        w = reg[0]
        out.append(
            f"regressed: {len(reg)} {_items(reg)} ({sig} significantly); worst {w['kind']} {w['name']}: "
            f"{w['metric']} {w['base']:.3f} -> {w['cand']:.3f}"
        )
    weak = limits.get("weak") or []
    if weak:
        out.append(
            f"weak (below {limits.get('weak_below', WEAK_BELOW)}): {len(weak)} {_items(weak)}: "
            + capped([f"{r['name']} {r['cand']:.2f}" for r in weak], cap=5)
        )
    fails = limits.get("failures") or []
    if fails:
        f = fails[0]
        out.append(f"most frequent failure: {f['kind']}: {f['count']} example(s) ({f['share']:.0%})")
    if limits.get("broken"):
        out.append(f"right before, wrong after fine-tuning: {capped(limits['broken'], cap=3)}")
    note = (limits.get("test_set") or {}).get("note")
    if note:
        out.append(f"test set: {note}")
    out += [f"note: {x}" for x in limits.get("notes", [])]
    return out[:n]


def _items(rows: list[dict]) -> str:
    kinds = sorted({r["kind"] for r in rows})
    names = {"class": "classes", "field": "fields"}
    return " and ".join(names.get(k, k + "s") if len(rows) > 1 else k for k in kinds)
