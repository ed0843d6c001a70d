"""Recipe ``preflight --nproc-per-node N``: the distributed checks on the real world size, before the
rental hours of a multi-GPU run are spent.

Features: the launch checks of ``train --nproc-per-node`` (devices, backend, FSDP block type,
global batch; one line, nothing launched); then, under torchrun, the checks of
:mod:`tuneproof.preflight.distributed` (shares, DDP weights agree after 2 steps, FSDP2 gradients
equal the single-process reference, FSDP units, per-rank peak memory). The torchrun command and the
world layout are recorded (``launch.json``), the checks in ``distributed_preflight.json`` and the
summary. A failed check fails the run (exit 3). This run does not replace ``tuneproof preflight``
(the single-process preflight ``train`` requires); it adds the checks only N processes can make.
"""

from __future__ import annotations

from tuneproof.context import StudyContext
from tuneproof.errors import CheckFailed
from tuneproof.recipes.common import record_inputs
from tuneproof.ui import console, table


def run_preflight_distributed(ctx: StudyContext, *, nproc: int, nnodes: int = 1, node_rank: int = 0,
                              rdzv_endpoint: str | None = None) -> str:
    """Run the distributed preflight; returns the run id.

    Raises:
        TuneproofError: a launch that cannot work (nothing launched).
        RankFailed: a rank failed or a collective timed out (the run is failed, the rank named).
        CheckFailed: a check failed (exit 3).
    """
    from tuneproof.io import read_json  # noqa: PLC0415
    from tuneproof.preflight.distributed import RESULT  # noqa: PLC0415
    from tuneproof.training.ddp import RankFailed, check_launch, launch, rank_failure, torchrun_command  # noqa: PLC0415

    layout = check_launch(ctx, nproc, nnodes)
    worker = ["preflight", "--study", str(ctx.study_dir)] + (["--data", str(ctx.data_root)] if ctx.data_root else [])
    if node_rank > 0:
        rc = launch(torchrun_command(nproc, nnodes, node_rank, rdzv_endpoint, worker), None)
        if rc:
            raise RankFailed(f"torchrun exited with code {rc} on node {node_rank}", hint="see node 0's run folder")
        return "(joined node 0's preflight)"
    with ctx.registry.run("preflight", name="distributed") as run:
        record_inputs(ctx, run)
        cmd = torchrun_command(nproc, nnodes, node_rank, rdzv_endpoint, worker + ["--run-id", run.id])
        run.write_json("launch.json", {"command": cmd, "layout": layout, "nproc": nproc, "nnodes": nnodes,
                                       "node_rank": node_rank, "rdzv_endpoint": rdzv_endpoint})
        run.update_summary(distributed=True, world_size=layout["world_size"], strategy=layout["strategy"], backend=layout["backend"],
                           launch=" ".join(cmd))
        console.print(f"[bold]{run.id}[/] distributed preflight on {layout['world_size']} processes ({layout['backend']})")
        rc = launch(cmd, run.dir)
        if rc != 0:
            kind, message = rank_failure(run.dir, layout["world_size"], layout["timeout_s"])
            if kind == "interrupted":
                raise KeyboardInterrupt(message)
            raise RankFailed(message)
        checks = read_json(run.dir / RESULT)["checks"]
        console.print(table(f"distributed preflight {run.id}", ["check", "result", "details"],
                            [[c["name"], "pass" if c["passed"] else "FAIL", c["message"]] for c in checks]))
        failed = [c for c in checks if not c["passed"]]
        run.update_summary(passed=not failed, checks={c["name"]: c["passed"] for c in checks})
        if failed:
            raise CheckFailed(f"distributed preflight: {len(failed)} check(s) failed: {failed[0]['name']}: {failed[0]['message']}",
                              hint=f"see {run.dir / RESULT}")
        return run.id
