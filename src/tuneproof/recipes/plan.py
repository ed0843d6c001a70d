"""Recipe ``plan``: the rental plan from this study's measured throughput (docs/PROTOCOL.md step 7).

Features (option that turns each on):
- ``--days`` (3, 7 or 30 usually): phases initial check, experiment, evaluation, resume margin
  and export, in hours, each with the measurement it comes from; ``--hourly-rate`` adds the cost
  (money, labelled as cost: of the rental, of the planned hours, of one variant);
- how many variants of the configured training budget fit (``--variants N`` plans for N and
  warns when they do not fit);
- the measurements: completed train runs (the training as it ran), else the latest preflight, for
  the step time; the rate used and its source are printed, with the preflight's own rate when the
  two differ; nothing measured is an error (exit 2), never a guess; the resume margin's rule (one
  interruption per variant: a fresh-process reload + up to ``training.checkpoint_every`` steps) is
  in its row, and a note says why when the margin exceeds the experiment;
- ``plan.json`` in the study folder (schema-versioned); the dossier shows it.
The logic is :mod:`tuneproof.deliver.rental_plan`.
"""

from __future__ import annotations

from typing import Any

from tuneproof.context import StudyContext
from tuneproof.deliver.rental_plan import (
    PLAN_FILE,
    check_plan_args,
    cost_lines,
    days_text,
    make_plan,
    measure,
    require_measured,
)
from tuneproof.io import write_json
from tuneproof.training.budget import total_steps
from tuneproof.ui import console, table, user_text


def split_sizes(ctx: StudyContext) -> dict[str, int]:
    """Split sizes from the latest recorded ``data.json`` (no data loading), else from the data."""
    for rec in reversed(ctx.registry.list()):
        data = ctx.registry.run_json(rec.id, "data.json")
        if data and data.get("sizes"):
            return dict(data["sizes"])
    return {n: len(v) for n, v in ctx.all_splits.items()}


def run_plan(
    ctx: StudyContext, *, days: float, hourly_rate: float | None = None, variants: int | None = None
) -> dict[str, Any]:
    """Compute, print and save the plan; returns it.

    Raises:
        TuneproofError: nothing measured yet (exit 2), bad arguments.
    """
    check_plan_args(days, hourly_rate, variants)  # before anything is read
    s = ctx.study
    measured = measure(ctx.registry)
    require_measured(measured)
    sizes = split_sizes(ctx)
    n_eval = sizes.get(s.eval.split, 0)
    if s.eval.max_examples:
        n_eval = min(n_eval, s.eval.max_examples)
    plan = make_plan(
        measured,
        days=days,
        hourly_rate=hourly_rate,
        steps=total_steps(s.training, sizes.get("train", 0)),
        checkpoint_every=s.training.checkpoint_every,
        n_eval=n_eval,
        n_test=sizes.get(s.data.test_split, 0),
        variants=variants,
    )
    write_json(ctx.study_dir / PLAN_FILE, plan)
    print_plan(plan)
    return plan


def print_plan(plan: dict[str, Any]) -> None:
    rows = [[p["phase"], f"{p['hours']:.2f}", p["basis"]] for p in plan["phases"]]
    rows.append(
        [
            "total",
            f"{plan['total_h']:.2f}",
            f"of {plan['available_h']:.0f} h rented ({days_text(plan['days'])}); spare {plan['spare_h']:.1f} h",
        ]
    )
    console.print(
        table(
            f"rental plan: {days_text(plan['days'])}, {plan['variants']} variant(s) "
            f"of {plan['steps_per_variant']} steps",
            ["phase", "hours", "basis"],
            rows,
        )
    )
    m = plan["measured"]
    console.print(
        f"measured: {m['s_per_step']:.3g} s/step ({m['step_source']}), "
        f"{m['eval_s_per_example']:.3g} s per evaluated example "
        f"({m['eval_source']}); reload {m['reload_source']}",
        soft_wrap=True,
    )
    console.print(
        "variants of the configured budget that fit: [bold]"
        f"{plan['variants_fit']}[/] ({plan['per_variant_h']:.2f} h each)"
    )
    for line in cost_lines(plan):
        console.print(line, soft_wrap=True)
    for note in plan.get("notes", []):
        console.print(f"note: {user_text(note)}", soft_wrap=True)
    for w in plan["warnings"]:
        console.print(f"[yellow]warning[/]: {user_text(w)}", soft_wrap=True)
