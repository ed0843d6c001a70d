"""Recipe ``report``: the dossier (Markdown), written atomically to ``dossier.md`` in the study.

Sections: hypothesis and guards; every run including failed, interrupted and invalid ones with
their reasons; baseline; comparisons with intervals and the guards' verdicts; the test split's
access log; the environment. A part whose command was not run says "not run yet".
"""

from __future__ import annotations

from pathlib import Path

from tuneproof.context import StudyContext
from tuneproof.io import atomic_write_text
from tuneproof.recipes.common import run_json
from tuneproof.registry import iso


def _md_table(cols: list[str], rows: list[list]) -> str:
    esc = lambda v: ("" if v is None else str(v)).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(esc(v) for v in r) + " |" for r in rows]
    return "\n".join(out)


def _f(x) -> str:
    return f"{x:.3f}" if isinstance(x, float) else ("-" if x is None else str(x))


def build_markdown(ctx: StudyContext) -> str:
    s = ctx.study
    reg = ctx.registry
    runs = reg.list()
    lines = [f"# Dossier: {s.name}", "", "## Hypothesis", "", f"- behaviour: {s.hypothesis.behaviour}",
             f"- task: {s.hypothesis.task}", f"- success: {s.hypothesis.success.metric} gains at least {s.hypothesis.success.min_gain}"]
    for g in s.hypothesis.guards:
        rule = "; ".join(x for x in [f"max drop {g.max_drop}" if g.max_drop is not None else "", f"floor {g.floor}" if g.floor is not None else ""] if x)
        lines.append(f"- guard: {g.metric} ({rule})")
    lines += ["", "## Runs (all of them)", ""]
    lines.append(_md_table(["id", "kind", "status", "reason", "parent", "created (UTC)"],
                           [[r.id, r.kind, r.status, r.reason or "", r.parent or "", iso(r.created)] for r in runs]) if runs else "not run yet")
    base = reg.latest("baseline")
    lines += ["", "## Baseline", ""]
    if base:
        lines.append(_md_table(["metric", "value"], [[k, _f(v)] for k, v in base.summary.get("metrics", {}).items()]))
    else:
        lines.append("not run yet")
    lines += ["", "## Comparisons", ""]
    compares = reg.list(kind="compare", status="completed")
    if not compares:
        lines.append("not run yet")
    for c in compares:
        data = run_json(ctx, c.id, "compare.json") or {}
        for cid, r in data.get("candidates", {}).items():
            cnt = r["counts"]
            lines += [f"### {cid} vs {data.get('baseline')} ({c.id})", "",
                      f"{r['n']} paired examples: fixed {cnt['fixed']}, broken {cnt['broken']}, unchanged right {cnt['unchanged_right']}, "
                      f"unchanged wrong {cnt['unchanged_wrong']}; McNemar exact p = {r['mcnemar']['p_value']:.4g}.", ""]
            lines.append(_md_table(["metric", "baseline", "candidate", "delta", "95% CI"],
                                   [[m, _f(v["base"]), _f(v["cand"]), _f(v["delta"]), "[" + ", ".join(_f(x) for x in (v.get("ci") or [None, None])) + "]"]
                                    for m, v in r["metrics"].items()]))
            lines.append("")
            for v in r.get("verdicts", []):
                lines.append(f"- {v['kind']} **{v['verdict']}**: {v['name']}: {v.get('detail', '')}")
            if r.get("overall"):
                lines.append(f"- overall: **{r['overall']['verdict']}** ({r['overall']['detail']})")
            for n in r.get("notes", []):
                lines.append(f"- note: {n}")
            lines.append("")
    lines += ["", "## Test split access log", ""]
    acc = reg.test_accesses()
    lines.append(_md_table(["run", "candidate", "time (UTC)"], [[a["run"], a["candidate"], iso(a["time"])] for a in acc]) if acc
                 else "the reserved test split has not been read")
    lines += ["", "## Environment", ""]
    env = run_json(ctx, runs[-1].id, "env.json") if runs else None
    if env:
        lines.append(_md_table(["key", "value"], [[k, v] for k, v in env.items() if not isinstance(v, (dict, list))]))
    else:
        lines.append("not run yet")
    return "\n".join(lines) + "\n"


def run_report(ctx: StudyContext) -> Path:
    """Write ``dossier.md``; returns its path."""
    path = ctx.study_dir / "dossier.md"
    atomic_write_text(path, build_markdown(ctx))
    return path
