"""Recipe ``show``: per-example outputs of an evaluation run, filtered by what changed against the
baseline (fixed / regressed: by the success metric's per-example rule, the basis of `compare`'s
paired counts), by class, or by field."""

from __future__ import annotations

from tuneproof import hypothesis as hyp
from tuneproof.context import StudyContext
from tuneproof.errors import TuneproofError
from tuneproof.evaluation.controls import latest_plain_baseline
from tuneproof.evaluation.recording import load_outputs
from tuneproof.recipes.compare import resolve_candidate
from tuneproof.tasks import get_task, task_config
from tuneproof.ui import console, print_json, table, user_text


def select(
    base: list[dict],
    cand: list[dict],
    *,
    regressed: bool = False,
    fixed: bool = False,
    category: str | None = None,
    field: str | None = None,
    passing=None,
) -> list[tuple[dict | None, dict]]:
    """Pairs ``(baseline record, candidate record)`` that pass the filters, in candidate order.

    ``passing(record) -> bool`` is the per-example rule behind fixed / regressed (the success
    metric's, as in ``compare``); default the record's ``correct``."""
    ok = passing or (lambda rec: bool(rec.get("correct")))
    by_id = {r["id"]: r for r in base}
    out = []
    for r in cand:
        b = by_id.get(r["id"])
        if regressed and not (b is not None and ok(b) and not ok(r)):
            continue
        if fixed and not (b is not None and not ok(b) and ok(r)):
            continue
        if category is not None and r.get("category") != category:
            continue
        if field is not None and field not in (r.get("scores", {}).get("fields") or {}):
            continue
        out.append((b, r))
    return out


def run_show(
    ctx: StudyContext,
    run_id: str,
    *,
    regressed: bool = False,
    fixed: bool = False,
    category: str | None = None,
    field: str | None = None,
    against: str | None = None,
    limit: int = 20,
    as_json: bool = False,
) -> int:
    """Print the selected examples (``as_json``: one JSON object on stdout, see :func:`show_json`); returns how many
    matched."""
    cid = resolve_candidate(ctx, run_id)
    _, cand = load_outputs(ctx, cid)
    base: list[dict] = []
    bid = None
    if regressed or fixed or against:
        plain = None if against else latest_plain_baseline(ctx.registry)  # a few-shot control: named, never default
        bid = against or (plain.id if plain is not None else None)
        if bid is None:
            raise TuneproofError("--regressed/--fixed need a completed baseline run", hint="run `tuneproof baseline`")
        _, base = load_outputs(ctx, bid)
    passing, basis = None, None
    if regressed or fixed:  # the rule of the paired counts of `compare`: the success metric's per-example rule
        kind, cfg = get_task(ctx.task), task_config(ctx)
        view = hyp.resolve(
            ctx.study_dir, ctx.study, ctx.registry, None
        ).primary  # the frozen hypothesis, as compare judges
        rule = kind.example_rule((view.get("success") or {}).get("metric"))
        base, _ = kind.score(base, cfg)  # re-scored: the rule reads this version's per-example scores
        cand, _ = kind.score(cand, cfg)
        passing = rule.passing
        basis = rule.description
        if not as_json:
            console.print(f"fixed / regressed by the success metric's rule: {rule.description}", soft_wrap=True)
    pairs = select(base, cand, regressed=regressed, fixed=fixed, category=category, field=field, passing=passing)
    if as_json:
        print_json({**show_json(cid, base and bid, pairs, limit, passing), "basis": basis})
        return len(pairs)
    if not pairs:  # an empty table reads as a fault; say what matched nothing
        what = "regressed" if regressed else "fixed" if fixed else "matching"
        console.print(f"{cid}: no {what} examples" + (f" against {bid}" if base else ""), soft_wrap=True)
        return 0
    # a baseline column only when a baseline is joined (--against/--regressed/--fixed): an empty one read as
    # a baseline that answered nothing
    cols = ["id", "category", "input", "reference", *(["baseline"] if base else []), "candidate"]
    rows = [
        [
            user_text("" if v is None else str(v))
            for v in (
                r["id"],
                r.get("category"),
                r.get("input"),
                r.get("reference"),
                *([(b or {}).get("prediction", "")] if base else []),
                r.get("prediction"),
            )
        ]
        for b, r in pairs[:limit]
    ]
    console.print(
        table(
            f"{cid}: {len(pairs)} examples"
            + (f", the first {len(rows)} shown (--limit N for more)" if len(rows) < len(pairs) else "")
            + ("" if base else "; --against BASELINE adds the baseline's outputs"),
            cols,
            rows,
            keep=("id",),
            drop=("category",),
            more="`tuneproof show --json` has every field",
        )
    )
    return len(pairs)


def show_json(
    run_id: str, baseline_id: str | None, pairs: list[tuple[dict | None, dict]], limit: int, passing=None
) -> dict:
    """``{"run", "baseline", "matched", "shown", "examples": [{"id", "category", "input", "reference",
    "candidate", "candidate_correct", "baseline", "baseline_correct"}]}`` for scripts (``show --json``);
    ``baseline*`` are null without --regressed/--fixed/--against; ``run_show`` adds ``basis``, the
    per-example rule behind --fixed / --regressed (null without them); with ``passing`` (that rule)
    each example also has ``candidate_passes`` / ``baseline_passes``."""
    rows = []
    for b, r in pairs[:limit]:
        rows.append(
            {
                "id": r["id"],
                "category": r.get("category"),
                "input": r.get("input"),
                "reference": r.get("reference"),
                "candidate": r.get("prediction"),
                "candidate_correct": r.get("correct"),
                "baseline": None if b is None else b.get("prediction"),
                "baseline_correct": None if b is None else b.get("correct"),
                **(
                    {"candidate_passes": bool(passing(r)), "baseline_passes": None if b is None else bool(passing(b))}
                    if passing
                    else {}
                ),
            }
        )
    return {"run": run_id, "baseline": baseline_id or None, "matched": len(pairs), "shown": len(rows), "examples": rows}
