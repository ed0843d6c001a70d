"""Recipe ``runs --tree``: the lineage of a study's runs as a tree (docs/PROTOCOL.md step 7).

Each train run sits under the run it was made ``--from``; evaluation and other runs sit under the
run they used (their ``parent``). Every node shows its status (with the reason for failed,
interrupted and invalid runs: none is hidden), the change of a variant relative to its parent
(from its summary; ``multi-change`` flagged), the protocol steps it skipped with their recorded
reasons (``--skip-preflight``, ``--skip-data-check``, ``--skip-baseline``), and for train runs the headline metric of
their latest completed eval child against the latest completed baseline. A delta is shown only when the
eval and the baseline share the evaluation fingerprint; otherwise the tree says they are not
comparable.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from rich.tree import Tree

from tuneproof.context import load_study
from tuneproof.evaluation.controls import control_kind, control_label
from tuneproof.hypothesis import frozen_record
from tuneproof.registry import Registry, RunRecord, override_flags
from tuneproof.ui import console, fmt, user_text

STATUS_STYLE = {"completed": "green", "running": "cyan", "failed": "red", "interrupted": "yellow", "invalid": "magenta"}


def success_metric(registry: Registry) -> str | None:
    """The success metric (``hypothesis.success.metric``) of the hypothesis frozen with the first
    train run, else the study file's; None when neither is readable."""
    try:
        rec = frozen_record(registry.study_dir, registry)
        if rec and (rec.get("hypothesis") or {}).get("success", {}).get("metric"):
            return rec["hypothesis"]["success"]["metric"]
    except Exception:  # noqa: BLE001
        pass
    try:
        return load_study(registry.study_dir).hypothesis.success.metric
    except Exception:  # noqa: BLE001  (the tree must show even when the study file is being edited)
        return None


def headline_of(metrics: dict[str, Any], preferred: str | None) -> tuple[str, float] | None:
    """``(name, value)``: the preferred metric when present, else the first scalar one."""
    if preferred and isinstance(metrics.get(preferred), (int, float)):
        return preferred, float(metrics[preferred])
    for k, v in metrics.items():
        if isinstance(v, (int, float)):
            return k, float(v)
    return None


def latest_eval(children: list[RunRecord]) -> RunRecord | None:
    evals = [c for c in children if c.kind == "eval" and c.status == "completed" and c.summary.get("metrics")]
    return evals[-1] if evals else None


def metric_text(rec: RunRecord, children: list[RunRecord], baseline: RunRecord | None, metric: str | None) -> str:
    """``field_f1 0.412 (+0.050 vs r0001, eval r0007)``, or why there is none."""
    source = rec if rec.kind in ("baseline", "eval", "test") else latest_eval(children)
    if source is None:
        return "[dim]not evaluated[/]" if rec.kind == "train" else ""
    head = headline_of(source.summary.get("metrics", {}), metric)
    if head is None:
        return ""
    name, value = head
    text = f"{name} {fmt(value)}"
    if rec.kind == "baseline" or baseline is None or source.id == baseline.id:
        return text + (f" [dim](eval {source.id})[/]" if source is not rec else "")
    base_head = headline_of(baseline.summary.get("metrics", {}), name)
    if base_head is None or base_head[0] != name:
        return text
    if source.eval_fingerprint and baseline.eval_fingerprint and source.eval_fingerprint != baseline.eval_fingerprint:
        return text + f" [red](eval procedure differs from {baseline.id}: not comparable)[/]"
    delta = value - base_head[1]
    style = "green" if delta > 0 else ("red" if delta < 0 else "dim")
    via = f", eval {source.id}" if source is not rec else ""
    return text + f" ([{style}]{delta:+.3f}[/] vs {baseline.id}{via})"


def node_label(rec: RunRecord, children: list[RunRecord], baseline: RunRecord | None, metric: str | None) -> str:
    style = STATUS_STYLE.get(rec.status, "")
    parts = [f"[bold]{user_text(rec.id)}[/] {rec.kind} [{style}]{rec.status}[/]"]
    if control_kind(rec) is not None:
        parts.append(f"[cyan]control: {user_text(control_label(rec), one_line=True)}[/]")
    if rec.reason and rec.status != "completed":
        parts.append(f"[{style}]({user_text(rec.reason, one_line=True)})[/]")
    variant = rec.summary.get("variant")
    if variant:
        parts.append(f"[cyan]{user_text(variant.get('change', ''), one_line=True)}[/]")
    if rec.summary.get("multi_change"):
        parts.append("[magenta]multi-change[/]")
    if rec.summary.get("resumes"):
        parts.append(f"[dim]resumed x{len(rec.summary['resumes'])}[/]")
    for flag in override_flags(rec.summary):
        parts.append(f"[yellow]{user_text(flag, one_line=True)}[/]")
    text = metric_text(rec, children, baseline, metric)
    if text:
        parts.append("· " + text)
    return " ".join(parts)


def build_tree(registry: Registry, runs: list[RunRecord]) -> Tree:
    """The lineage tree of ``runs`` (a run whose parent is not in ``runs`` is a root)."""
    ids = {r.id for r in runs}
    children: dict[str | None, list[RunRecord]] = defaultdict(list)
    for r in runs:
        children[r.parent if r.parent in ids else None].append(r)
    baselines = [  # a few-shot control is shown, never the reference of the deltas (evaluation/controls.py)
        r
        for r in runs
        if r.kind == "baseline" and r.status == "completed" and r.summary.get("metrics") and control_kind(r) is None
    ]
    baseline = baselines[-1] if baselines else None
    metric = success_metric(registry)
    name = Path(registry.study_dir).resolve().name  # `--study .` has no name of its own
    title = f"[bold]{user_text(name, one_line=True)}[/] ({len(runs)} runs"
    title += f"; headline {metric}" if metric else ""
    title += f"; baseline {baseline.id})" if baseline else "; no completed baseline)"
    tree = Tree(title)

    def add(node: Tree, rec: RunRecord, seen: set[str]) -> None:
        kids = children.get(rec.id, [])
        branch = node.add(node_label(rec, kids, baseline, metric))
        for kid in kids:
            if kid.id not in seen:  # a cycle cannot be made by the CLI; guard anyway
                add(branch, kid, seen | {kid.id})

    for root in children.get(None, []):
        add(tree, root, {root.id})
    return tree


def print_tree(registry: Registry, runs: list[RunRecord]) -> None:
    """Print the lineage tree (``tuneproof runs --tree``)."""
    console.print(build_tree(registry, runs))
