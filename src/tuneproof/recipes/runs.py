"""Recipe ``runs``: every run with its status, reason, parent and headline metrics."""

from __future__ import annotations

from pathlib import Path

from tuneproof.recipes.protocol import override_flags
from tuneproof.registry import Registry, iso
from tuneproof.ui import console, fmt, table

STATUS_STYLE = {"completed": "green", "running": "cyan", "failed": "red", "interrupted": "yellow", "invalid": "magenta"}


def runs_json(reg: Registry) -> list[dict]:
    """Every run record as plain JSON values (times as ISO 8601 UTC), oldest first."""
    return [{"id": r.id, "kind": r.kind, "status": r.status, "reason": r.reason, "parent": r.parent, "name": r.name,
             "created": iso(r.created), "ended": iso(r.ended) if r.ended else None, "config_hash": r.config_hash,
             "data_fingerprint": r.data_fingerprint, "eval_fingerprint": r.eval_fingerprint, "summary": r.summary}
            for r in reg.list()]


def show_runs(study: Path, *, tree: bool = False, as_json: bool = False) -> None:
    reg = Registry(study)
    if as_json:
        import json  # noqa: PLC0415
        import sys  # noqa: PLC0415

        sys.stdout.write(json.dumps(runs_json(reg), indent=2, default=str) + "\n")
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
        if r.summary.get("multi_change"):
            flags.append("multi-change variant")
        style = STATUS_STYLE.get(r.status, "")
        rows.append([
            r.id, r.kind, f"[{style}]{r.status}[/]", r.reason or "", r.parent or "", iso(r.created)[5:16],
            " ".join(f"{k}={fmt(v, 2)}" for k, v in list(metrics.items())[:2]), "; ".join(flags),
        ])
    if tree:
        from tuneproof.recipes.lineage import print_tree  # noqa: PLC0415

        print_tree(reg, runs)
        return
    console.print(table("runs", ["id", "kind", "status", "reason", "parent", "created", "metrics", "flags"], rows))
