"""Recipe ``data check``: the data protocol's evidence before any compute (PROTOCOL.md step 3).

Features:
- data version: fingerprint of the cleaned examples + ordered cleaning rules + preprocessing
  config; frozen split manifest (created or reused); encoding repairs (CASES C17);
- duplicates: exact, normalised and MinHash near-duplicates across every pair of splits and
  inside train (``data.dedup``; BANKING77 train/test overlap, CASES C14);
- audits: class counts and imbalance, classes missing from a split, same text with different
  labels, targets that are not strict JSON (CASES C16), missing required fields;
- the exact preprocessing of the trainer on every train and eval example: 0 supervised tokens
  (C4), end token not supervised (C2), boundary inside a token (C3), prefix mismatch;
- token lengths per split (p50, p95, max), share truncated, suggested max_length;
- the hypothesis against the data, before the run (bad input, exit 2): a guard's ``classes`` that
  are not labels, a format rule (``eval.regex`` / ``eval.json_schema``) no gold target satisfies.
Hard faults fail the run (exit 3) after the report is written.
"""

from __future__ import annotations

from typing import Any

from tuneproof.context import StudyContext
from tuneproof.errors import CheckFailed
from tuneproof.recipes.common import record_inputs
from tuneproof.ui import console, fmt, table


def data_report(ctx: StudyContext) -> dict[str, Any]:
    """Build the data check report (JSON-safe); no registry side effects."""
    from tuneproof.data.audit import audit_labels, audit_targets  # noqa: PLC0415
    from tuneproof.data.dedup import find_duplicates  # noqa: PLC0415
    from tuneproof.data.lengths import length_stats  # noqa: PLC0415

    s = ctx.study
    splits = ctx.all_splits
    d = s.data.dedup
    dedup = find_duplicates(splits, threshold=d.threshold, shingles=d.shingles, ngram=d.ngram, num_perm=d.num_perm)
    labels = audit_labels(splits)
    targets = None
    if ctx.task in ("extraction", "format"):
        targets = audit_targets([e for v in splits.values() for e in v], s.hypothesis.required_fields or None)
    encoded = {name: ctx.pipeline.encode_all(items) for name, items in splits.items() if name != s.data.test_split}
    faults = [{"id": e.id, "split": name, "prompt_tokens": e.prompt_tokens, "answer_tokens": e.answer_tokens, "fault": f}
              for name, items in encoded.items() for e in items for f in e.faults]
    lengths = length_stats({name: [e.full_length for e in items] for name, items in encoded.items()}, s.training.max_length)
    hard = list(labels.get("hard_faults", [])) + (targets or {}).get("hard_faults", []) + [
        f"{f['split']}/{f['id']}: {f['fault']}" for f in faults]
    warnings = list(labels.get("warnings", [])) + lengths.get("warnings", []) + [
        line for line in dedup.summary_lines() if "no duplicates" not in line]
    return {
        "fingerprint": ctx.data_fingerprint(), "manifest_created": getattr(ctx, "manifest_created", None),
        "sizes": {n: len(v) for n, v in splits.items()}, "repairs": ctx.repairs,
        "dropped_by_dedup": getattr(ctx, "dedup_dropped", []),
        "dedup": dedup.to_dict(), "labels": labels, "targets": targets, "encoding_faults": faults,
        "lengths": lengths, "supervised_tokens": {n: sum(e.n_supervised for e in v) for n, v in encoded.items()},
        "hard_faults": hard, "warnings": warnings, "passed": not hard,
    }


def run_data_check(ctx: StudyContext) -> str:
    """Run the data check as a registry run; raises :class:`CheckFailed` (exit 3) on hard faults."""
    from tuneproof.hypothesis import check_against_data  # noqa: PLC0415
    from tuneproof.study import STUDY_FILE  # noqa: PLC0415

    notes = check_against_data(ctx.study, ctx.all_splits, ctx.study_dir / STUDY_FILE)  # bad input: exit 2 before any run
    with ctx.registry.run("data-check") as run:
        record_inputs(ctx, run)
        rep = data_report(ctx)
        rep["hypothesis_notes"] = notes
        rep["warnings"] += notes
        run.write_json("data_check.json", rep)
        run.update_summary(passed=rep["passed"], hard_faults=len(rep["hard_faults"]), sizes=rep["sizes"],
                           lengths={k: {m: v.get(m) for m in ("p50", "p95", "max", "truncated_share")} for k, v in rep["lengths"]["splits"].items()},
                           suggest_max_length=rep["lengths"].get("suggest_max_length"),
                           duplicates=[line for line in rep["warnings"] if "overlap" in line or "duplicate" in line][:6])
        _print(rep)
        if not rep["passed"]:
            raise CheckFailed(f"data check {run.id}: {len(rep['hard_faults'])} hard faults, first: {rep['hard_faults'][0]}",
                              hint=f"see {run.path('data_check.json')}")
        return run.id


def _print(rep: dict[str, Any]) -> None:
    console.print(f"data fingerprint {rep['fingerprint']['hash'][:16]}; splits " +
                  ", ".join(f"{k} {v}" for k, v in rep["sizes"].items()))
    for r in rep["repairs"]:
        console.print(f"[yellow]repaired[/] {r}")
    rows = [[k, fmt(v.get("p50"), 0), fmt(v.get("p95"), 0), v.get("max"), fmt(v.get("truncated_share"))]
            for k, v in rep["lengths"]["splits"].items()]
    console.print(table(f"token lengths (max_length {rep['lengths']['max_length']}, suggested {rep['lengths'].get('suggest_max_length')})",
                        ["split", "p50", "p95", "max", "truncated share"], rows))
    for w in rep["warnings"]:
        console.print(f"[yellow]warning[/] {w}")
    for h in rep["hard_faults"][:20]:
        console.print(f"[red]fault[/] {h}")
    console.print("[green]data check passed[/]" if rep["passed"] else f"[red]data check failed: {len(rep['hard_faults'])} hard faults[/]")
