"""Recipe ``show``: per-example outputs of an evaluation run, filtered by what changed against the
baseline (fixed / regressed), by class, or by field."""

from __future__ import annotations

from tuneproof.context import StudyContext
from tuneproof.errors import TuneproofError
from tuneproof.recipes.common import load_outputs
from tuneproof.recipes.compare import resolve_candidate
from tuneproof.ui import console, table


def select(base: list[dict], cand: list[dict], *, regressed: bool = False, fixed: bool = False,
           category: str | None = None, field: str | None = None) -> list[tuple[dict | None, dict]]:
    """Pairs ``(baseline record, candidate record)`` that pass the filters, in candidate order."""
    by_id = {r["id"]: r for r in base}
    out = []
    for r in cand:
        b = by_id.get(r["id"])
        if regressed and not (b is not None and b.get("correct") and not r.get("correct")):
            continue
        if fixed and not (b is not None and not b.get("correct") and r.get("correct")):
            continue
        if category is not None and r.get("category") != category:
            continue
        if field is not None and field not in (r.get("scores", {}).get("fields") or {}):
            continue
        out.append((b, r))
    return out


def run_show(ctx: StudyContext, run_id: str, *, regressed: bool = False, fixed: bool = False, category: str | None = None,
             field: str | None = None, against: str | None = None, limit: int = 20) -> int:
    """Print the selected examples; returns how many matched."""
    cid = resolve_candidate(ctx, run_id)
    _, cand = load_outputs(ctx, cid)
    base: list[dict] = []
    if regressed or fixed or against:
        bid = against or (ctx.registry.latest("baseline").id if ctx.registry.latest("baseline") else None)
        if bid is None:
            raise TuneproofError("--regressed/--fixed need a completed baseline run", hint="run `tuneproof baseline`")
        _, base = load_outputs(ctx, bid)
    pairs = select(base, cand, regressed=regressed, fixed=fixed, category=category, field=field)
    rows = [[r["id"], r.get("category"), r.get("input"), r.get("reference"), (b or {}).get("prediction", ""), r.get("prediction")]
            for b, r in pairs[:limit]]
    console.print(table(f"{cid}: {len(pairs)} examples", ["id", "category", "input", "reference", "baseline", "candidate"], rows))
    return len(pairs)
