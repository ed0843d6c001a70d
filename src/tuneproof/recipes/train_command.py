"""``train``: the command as a whole, behind the protocol's gates and the rental's hold.

Three ways in, each refusing bad input before anything runs:

- one process (the default): the order rules (data check, baseline of this evaluation procedure,
  ``recipes/protocol.py``), a passed preflight (``recipes/preflight.py: require_preflight``), then
  :func:`tuneproof.recipes.train.run_train` inside the rental window (``recipes/rental.py: spend``);
- ``--nproc-per-node`` / ``--nnodes``: the launch check first (``recipes/torchrun.py: check_launch``,
  one line, nothing launched), the gates on node 0 (which records the run), then torchrun;
- ``--from RUN`` (with ``--set`` / ``--grid`` / ``--allow-multi-change``): variants of a train run
  (``recipes/variants.py``), each through the same gates.

``skip_*`` overrides are reasons, recorded with the run.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path

from tuneproof.context import StudyContext
from tuneproof.errors import TuneproofError
from tuneproof.recipes.preflight import require_preflight
from tuneproof.recipes.protocol import require_order
from tuneproof.recipes.rental import spend
from tuneproof.recipes.torchrun import check_launch, run_train_distributed
from tuneproof.recipes.train import TrainOptions, run_train
from tuneproof.recipes.variants import run_variants
from tuneproof.registry import trained_paths_line
from tuneproof.ui import console, user_text


@dataclass
class TrainCommand:
    """The options of ``tuneproof train`` (the CLI's flags, by the same names)."""

    name: str | None = None
    skip_preflight: str | None = None
    skip_data_check: str | None = None
    skip_baseline: str | None = None
    from_run: str | None = None
    sets: list[str] = field(default_factory=list)
    grid: str | None = None
    allow_multi_change: bool = False
    nproc_per_node: int | None = None
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    use_reserve: str | None = None

    @property
    def distributed(self) -> bool:
        """More than one process: ``--nproc-per-node`` above 1 or ``--nnodes`` above 1."""
        return (self.nproc_per_node is not None and self.nproc_per_node > 1) or self.nnodes > 1


def run_train_command(study: Path, data: Path | None, opts: TrainCommand) -> list[str]:
    """Run ``tuneproof train`` and print where each run ended; returns the train run ids.

    Raises:
        TuneproofError: a bad combination of options (``--from`` with ``--nproc-per-node``,
            ``--set`` without ``--from``), a launch that cannot run here, or what the gates refuse.
        CheckFailed: a gate's check failed (the data check, the rental's reserve).
    """
    if opts.distributed:
        return [_distributed(study, data, opts)]
    if opts.from_run is not None:
        with spend(study, "train", override=opts.use_reserve, data=data, variant=(opts.from_run, opts.sets, opts.grid)):
            done = run_variants(
                study,
                data,
                opts.from_run,
                sets=opts.sets,
                grid=opts.grid,
                name=opts.name,
                allow_multi_change=opts.allow_multi_change,
                preflight=require_preflight,
                preflight_override=opts.skip_preflight,
                data_check_override=opts.skip_data_check,
                baseline_override=opts.skip_baseline,
            )
        for r in done:
            console.print(f"variant [bold]{r['run']}[/] {r['status']} ({user_text(r['change'], one_line=True)})")
            if r["status"] == "completed":
                console.print(user_text(trained_paths_line(study, r["run"])), soft_wrap=True)
        return [r["run"] for r in done]
    if opts.sets or opts.grid or opts.allow_multi_change:
        raise TuneproofError(
            "--set, --grid and --allow-multi-change make a variant: they need --from RUN",
            hint="e.g. tuneproof train --from r0004 --set method.r=16",
        )
    ctx = StudyContext.open(study, data)
    order = require_order(ctx, data_check_override=opts.skip_data_check, baseline_override=opts.skip_baseline)
    order["preflight_run"] = require_preflight(ctx, opts.skip_preflight)
    with spend(study, "train", override=opts.use_reserve, ctx=ctx):
        run_id = run_train(ctx, TrainOptions(name=opts.name, preflight_override=opts.skip_preflight, order=order))
    console.print(f"train run [bold]{run_id}[/] completed; next: tuneproof eval {run_id}")
    console.print(user_text(trained_paths_line(study, run_id)), soft_wrap=True)
    return [run_id]


def _distributed(study: Path, data: Path | None, opts: TrainCommand) -> str:
    """The torchrun launch: checked first, the gates on node 0, the run recorded by node 0."""
    if opts.from_run is not None or opts.sets or opts.grid:
        raise TuneproofError(
            "--from/--set/--grid with --nproc-per-node is not supported",
            hint="train the variant in one process, or copy its config into the study file",
        )
    ctx = StudyContext.open(study, data)
    nproc = opts.nproc_per_node or 1
    check_launch(ctx, nproc, opts.nnodes)  # bad input first: one line, nothing run or launched
    order = None
    hold = contextlib.nullcontext()
    if opts.node_rank == 0:  # node 0 records the run: the protocol gates are checked there
        order = require_order(ctx, data_check_override=opts.skip_data_check, baseline_override=opts.skip_baseline)
        order["preflight_run"] = require_preflight(ctx, opts.skip_preflight)
        hold = spend(study, "train", override=opts.use_reserve, ctx=ctx)
    with hold:
        run_id = run_train_distributed(
            ctx,
            nproc=nproc,
            nnodes=opts.nnodes,
            node_rank=opts.node_rank,
            rdzv_endpoint=opts.rdzv_endpoint,
            name=opts.name,
            preflight_override=opts.skip_preflight,
            order=order,
        )
    console.print(f"train run [bold]{run_id}[/] completed; next: tuneproof eval {run_id}")
    if run_id is not None:
        console.print(user_text(trained_paths_line(study, run_id)), soft_wrap=True)
    return run_id
