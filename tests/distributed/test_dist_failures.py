"""A rank that raises marks the run failed naming the rank and its error; a launch that cannot work
is refused in one line with nothing launched (docs/PROTOCOL.md step 6, bad input)."""

from __future__ import annotations

import os
import textwrap

import pytest
import torch

from dist_helpers import SKIP, dist_study, run_cli
from tuneproof.context import StudyContext
from tuneproof.errors import TuneproofError
from tuneproof.recipes.preflight import matching_preflight
from tuneproof.recipes.torchrun import check_launch
from tuneproof.registry import Registry
from tuneproof.training.parallel import block_classes

pytestmark = pytest.mark.slow  # torchrun on 2 gloo processes: left out of the inner loop (`pytest -m "not slow"`)

# imported by every Python process started with this folder first on PYTHONPATH; acts on rank 1 only
FAULT = textwrap.dedent(
    """
    import os
    if os.environ.get("RANK") == "1":
        import tuneproof.training.loop as L
        _orig, _calls = L._micro_loss, [0]
        def _micro_loss(*a, **kw):
            _calls[0] += 1
            if _calls[0] == 3:  # the first micro-batch of step 2
                raise ValueError("injected fault on rank 1")
            return _orig(*a, **kw)
        L._micro_loss = _micro_loss
    """
)


def test_a_rank_that_raises_fails_the_run_naming_the_rank(tiny_base, tmp_path):
    study = dist_study(
        tmp_path / "s", tiny_base, max_steps=4, micro_batch_size=2, gradient_accumulation_steps=2, timeout_s=60
    )
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(FAULT)
    proc = run_cli(
        "train",
        "--study",
        str(study),
        "--skip-preflight",
        "fault test",
        *SKIP,
        "--nproc-per-node",
        "2",
        extra_path=hook,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "rank 1 failed: ValueError: injected fault on rank 1" in " ".join(proc.stdout.split())
    (rec,) = Registry(study).list(kind="train")
    assert rec.status == "failed"
    assert rec.reason.startswith("RankFailed: rank 1 failed: ValueError: injected fault on rank 1")
    run_dir = Registry(study).runs_dir / rec.id
    assert "injected fault on rank 1" in (run_dir / "rank-1.log").read_text()
    assert not (run_dir / "adapter").exists()
    assert rec.summary["last_step"] == 1  # rank 0 finished step 1, then waited for rank 1 in step 2


# rank 1 dies by SIGKILL in the first micro-batch of step 2
KILL = textwrap.dedent(
    """
    import os, signal
    if os.environ.get("RANK") == "1":
        import tuneproof.training.loop as L
        _orig, _calls = L._micro_loss, [0]
        def _micro_loss(*a, **kw):
            _calls[0] += 1
            if _calls[0] == 3:
                os.kill(os.getpid(), signal.SIGKILL)
            return _orig(*a, **kw)
        L._micro_loss = _micro_loss
    """
)


def test_a_killed_rank_is_named_not_the_survivor(tiny_base, tmp_path):
    """kill -9 of rank 1: the reason named rank 0 (the survivor, from the error files); torchrun's own report
    names the dead rank, its signal and exit code. (Resuming such a run: tests/training/test_resume_exact.py.)"""
    study = dist_study(
        tmp_path / "s", tiny_base, max_steps=3, micro_batch_size=2, gradient_accumulation_steps=2, timeout_s=20
    )
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(KILL)
    proc = run_cli(
        "train", "--study", str(study), "--skip-preflight", "kill", *SKIP, "--nproc-per-node", "2", extra_path=hook
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    (rec,) = Registry(study).list(kind="train")
    assert rec.status == "failed"
    assert rec.reason.startswith(
        "RankFailed: rank 1 was killed by signal 9 (SIGKILL) without reporting an error (torchrun: exit code -9, pid "
    ), rec.reason
    # the survivor follows, never as the cause: its gloo error ("rank 0 then failed: RuntimeError: [...]"), or
    # "rank 0 was killed by signal 15 (SIGTERM)" when torchrun stopped it before it could report
    assert "; rank 0 " in rec.reason


@pytest.fixture()
def ctx(tiny_base, tmp_path):
    return StudyContext.open(dist_study(tmp_path / "s", tiny_base, micro_batch_size=2, gradient_accumulation_steps=2))


def test_more_processes_than_cpu_cores_is_refused(ctx):
    n = (os.cpu_count() or 1) + 1
    with pytest.raises(TuneproofError, match=rf"--nproc-per-node {n}: this machine has {n - 1} CPU cores"):
        check_launch(ctx, n)


def test_nccl_without_gpus_is_refused(ctx):
    ctx.study.distributed.backend = "nccl"
    with pytest.raises(TuneproofError, match="distributed.backend nccl needs CUDA GPUs"):
        check_launch(ctx, 2)


def test_global_batch_larger_than_the_training_set_is_refused(ctx):
    ctx.study.training.micro_batch_size = 8  # 8 x 2 x 2 = 32 > 24
    with pytest.raises(
        TuneproofError, match=r"global batch 8 .* x 2 .* x 2 processes = 32 exceeds the 24 training examples"
    ):
        check_launch(ctx, 2)


def test_chunked_loss_is_refused_before_launch_and_a_distributed_preflight_is_not_the_preflight(ctx):
    """chunked_loss under DDP/FSDP was refused only inside a rank after the launch; with only a distributed
    preflight passed, `train` said "the platform (None -> cpu) changed"."""
    ctx.study.training.chunked_loss = True
    with pytest.raises(TuneproofError, match=r"training.chunked_loss is not yet checked under DDP/FSDP"):
        check_launch(ctx, 2)
    assert check_launch(ctx, 1)["world_size"] == 1  # one process: the rank's own check runs it
    ctx.study.training.chunked_loss = False
    with ctx.registry.run("preflight", name="distributed") as run:
        run.update_summary(distributed=True, world_size=2)
    assert matching_preflight(ctx)[1] == (
        f"no preflight has passed in this study; only the distributed preflight {run.id} "
        "(`tuneproof preflight --nproc-per-node N`), which checks the distributed step and does not replace the "
        "single-process `tuneproof preflight`"
    )


def test_fsdp_needs_a_known_block_type(ctx):
    with pytest.raises(TuneproofError, match="declares no decoder block type"):
        block_classes(torch.nn.Sequential(torch.nn.Linear(2, 2)))
    ctx.study.distributed.strategy = "fsdp"
    layout = check_launch(ctx, 2)  # the tiny Llama: its decoder block, read on the meta device
    assert layout["fsdp_units"] == ["LlamaDecoderLayer"]
    assert (layout["world_size"], layout["global_batch"], layout["optimizer_steps_per_epoch"]) == (2, 8, 3)


def test_cli_refusal_is_one_line_and_creates_no_run(ctx):
    proc = run_cli(
        "train",
        "--study",
        str(ctx.study_dir),
        "--skip-preflight",
        "x",
        *SKIP,
        "--nproc-per-node",
        str((os.cpu_count() or 1) + 1),
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "this machine has" in proc.stdout
    assert Registry(ctx.study_dir).list() == []
