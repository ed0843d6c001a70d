"""Recipe ``runs``: every run with its status, reason, parent and headline metrics."""

from __future__ import annotations

from pathlib import Path

from tuneproof.evaluation.controls import control_kind, control_label
from tuneproof.recipes.lineage import print_tree
from tuneproof.registry import Registry, iso, override_flags, resume_hint
from tuneproof.ui import console, fmt, print_json, table, user_text

STATUS_STYLE = {"completed": "green", "running": "cyan", "failed": "red", "interrupted": "yellow", "invalid": "magenta"}


def runs_json(reg: Registry) -> list[dict]:
    """Every run record as plain JSON values (times as ISO 8601 UTC), oldest first."""
    return [
        {
            "id": r.id,
            "kind": r.kind,
            "status": r.status,
            "reason": r.reason,
            "parent": r.parent,
            "name": r.name,
            "created": iso(r.created),
            "ended": iso(r.ended) if r.ended else None,
            "config_hash": r.config_hash,
            "data_fingerprint": r.data_fingerprint,
            "eval_fingerprint": r.eval_fingerprint,
            "summary": r.summary,
        }
        for r in reg.list()
    ]


def run_overrides(summary: dict) -> list[str]:
    """The overrides of a variant (``["training.learning_rate=0.01"]``), empty for other runs; a run
    recorded before the summary kept them shows its ``change`` text (``key: old -> new``) piece by piece."""
    variant = summary.get("variant") or {}
    if variant.get("overrides"):
        return [str(o) for o in variant["overrides"]]
    return [p for p in str(variant.get("change") or "").split("; ") if p]


def show_runs(study: Path, *, tree: bool = False, as_json: bool = False) -> None:
    reg = Registry(study)
    if as_json:
        print_json(runs_json(reg))
        return
    runs = reg.list()
    if not runs:
        console.print("no runs yet")
        return
    baseline_fp = next((r.data_fingerprint for r in runs if r.kind == "baseline" and r.status == "completed"), None)
    rows = []
    for r in runs:
        metrics = r.summary.get("metrics", {})
        flags = []
        if baseline_fp and r.data_fingerprint and r.data_fingerprint != baseline_fp:
            flags.append("data differs from baseline")
        flags += override_flags(r.summary)
        if control_kind(r) is not None:  # baseline --few-shot K: a control, not the baseline train is gated on
            flags.append(f"control: {control_label(r)}")
        if r.summary.get("multi_change"):
            flags.append("multi-change variant")
        if isinstance(r.summary.get("clock_went_back"), dict):  # times as read, flagged (registry.clock_flag)
            flags.append(f"clock went back {r.summary['clock_went_back'].get('seconds', 0) / 3600:.2f} h while it ran")
        if r.summary.get("rental_window_ended"):
            flags.append(str(r.summary["rental_window_ended"]))
        hint = (
            resume_hint(reg.run_dir(r.id), r.id, r.kind, int(r.summary.get("world_size") or 1))
            if r.status == "interrupted"
            else None
        )
        if hint and "tuneproof resume" not in (r.reason or ""):  # the next step, said once
            flags.append(hint)
        style = STATUS_STYLE.get(r.status, "")
        ident = "\n".join([r.id] + [f"[cyan]{user_text(o, one_line=True)}[/]" for o in run_overrides(r.summary)])
        rows.append(
            [
                ident,
                r.kind,
                f"[{style}]{r.status}[/]",
                "\n".join(user_text(t, one_line=True) for t in [r.reason or ""] + flags if t),
                r.parent or "",
                iso(r.created)[5:16],
                user_text(" ".join(f"{k}={fmt(v, 2)}" for k, v in list(metrics.items())[:2])),
            ]
        )
    if tree:
        print_tree(reg, runs)
        return
    # the id (with a variant's overrides below it) and the parent identify a run: never cut, nor is a
    # metric (json_valid_rate=0.00 folded reads as another number); the reason column also holds the
    # flags; at 80 columns without a terminal the creation time, then the metrics, then the parent make
    # room (`runs --tree` shows the parents)
    console.print(
        table(
            "runs",
            ["id", "kind", "status", "reason", "parent", "created", "metrics"],
            rows,
            keep=("id", "parent", "metrics"),
            drop=("created", "metrics", "parent"),
            more="`tuneproof runs --json` has every field",
        )
    )
