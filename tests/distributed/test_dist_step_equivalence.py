"""DDP and FSDP2 on 2 gloo processes (torchrun --standalone) against one process on the concatenated
batch (docs/PROTOCOL.md step 6; docs/CASES.md C1 across ranks, docs/CASES.md C10, C11 after the step,
docs/CASES.md C24).

Same global batch of 8: one process with micro-batch 4 x accumulation 2, or 2 ranks with micro-batch 2
x accumulation 2. ``DistributedSampler`` hands rank r the permutation's positions r, r+2, ..., so a
step of the 2 ranks reads exactly the 8 examples the single process reads; LoRA dropout is 0 so both
compute the same function. The per-step loss (per-token mean over the global window) and the gradient
norm before clipping must agree within fp32 tolerance: a gradient left averaged over ranks (no x world
size) would halve the norm, a per-rank mean would change the loss.
"""

from __future__ import annotations

import pytest
import torch

from dist_helpers import SKIP, dist_study, metrics, run_cli, summary
from tiny_study import adapter_tensors
from tuneproof.context import StudyContext
from tuneproof.registry import Registry
from tuneproof.training.data_order import window_at
from tuneproof.training.resume_state import latest_checkpoint, load_checkpoint

pytestmark = pytest.mark.slow  # torchrun on 2 gloo processes: left out of the inner loop (`pytest -m "not slow"`)

STEPS = 4


@pytest.fixture(scope="module")
def reference(tiny_base, tmp_path_factory):
    """One process, micro-batch 4 x accumulation 2."""
    from tuneproof.context import StudyContext
    from tuneproof.recipes.train import TrainOptions, run_train

    study = dist_study(
        tmp_path_factory.mktemp("single") / "s",
        tiny_base,
        max_steps=STEPS,
        micro_batch_size=4,
        gradient_accumulation_steps=2,
    )
    ctx = StudyContext.open(study)
    run_dir = ctx.registry.runs_dir / run_train(ctx, TrainOptions(data_check_override="test", baseline_override="test"))
    return {
        "losses": load_checkpoint(latest_checkpoint(run_dir))["losses"],
        "metrics": metrics(run_dir),
        "adapter": adapter_tensors(run_dir),
    }


def _distributed(tiny_base, folder, strategy):
    study = dist_study(
        folder, tiny_base, strategy=strategy, max_steps=STEPS, micro_batch_size=2, gradient_accumulation_steps=2
    )
    proc = run_cli(
        "train", "--study", str(study), "--skip-preflight", "distributed test", *SKIP, "--nproc-per-node", "2"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    reg = Registry(study)
    (rec,) = reg.list(kind="train")
    assert rec.status == "completed"
    return reg.runs_dir / rec.id


def _assert_equivalent(run_dir, reference, strategy):
    ckpt = load_checkpoint(latest_checkpoint(run_dir))
    assert ckpt["data"]["world_size"] == 2 and len(ckpt["rng_ranks"]) == 2
    assert len(ckpt["losses"]) == STEPS
    for got, want in zip(ckpt["losses"], reference["losses"]):
        assert abs(got - want) < 1e-5, (ckpt["losses"], reference["losses"])
    rows = metrics(run_dir)
    assert sorted(rows) == [1, 2, 3, 4]  # rank 0 alone logged: one row per step
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == STEPS
    for step, row in rows.items():
        ref = reference["metrics"][step]
        assert row["supervised_tokens"] == ref["supervised_tokens"]  # the all-reduced global window
        assert row["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-5)
    got = adapter_tensors(run_dir)
    assert sorted(got) == sorted(reference["adapter"]) and len(got) == 8
    for name, tensor in reference["adapter"].items():
        assert got[name].shape == tensor.shape, name  # whole tensors, not one rank's slice (docs/CASES.md C24)
        assert torch.allclose(got[name], tensor, atol=1e-5), (name, float((got[name] - tensor).abs().max()))
    s = summary(run_dir)
    assert (s["world_size"], s["strategy"], s["backend"], s["global_batch"]) == (2, strategy, "gloo", 8)
    assert (s["optimizer_steps_per_epoch"], s["micro_batches_per_process_per_epoch"]) == (
        3,
        6,
    )  # 24 examples / 8 per step
    assert "2 processes" in s["loss_normalisation"] and "x 2" in s["loss_normalisation"]
    # docs/CASES.md C10: what the two ranks actually read in the first epoch: 12 each, disjoint, all 24 covered
    assert s["shares"] == {
        "per_rank": [12, 12],
        "overlap": 0,
        "padding_repeats": 0,
        "disjoint": True,
        "covered": 24,
        "n": 24,
        "epoch_complete": True,
    }
    check = s["save_check"]
    assert check["passed"] and check["tensors"] == 8 and check["lora_B"] == 4 and check["lora_B_all_zero"] == 0
    assert check["max_abs_logit_diff"] <= 1e-4 and check["top5_ids_equal"] and check["examples"] == 4
    # docs/CASES.md C11 after the step: only LoRA weights changed
    assert check["frozen_checked"] > 0 and check["frozen_changed"] == 0
    assert all(bool(got[n].any()) for n in got if "lora_B" in n)  # lora_B not all zeros after training
    assert (run_dir / "rank-0.log").is_file() and (run_dir / "rank-1.log").is_file()
    assert "end: completed" in (run_dir / "rank-1.log").read_text()
    return s


def test_ddp_step_equals_single_process_on_the_concatenated_batch(reference, tiny_base, tmp_path):
    run_dir = _distributed(tiny_base, tmp_path / "ddp", "ddp")
    _assert_equivalent(run_dir, reference, "ddp")
    # docs/CASES.md C1 across ranks: the two ranks hold different supervised token counts in step 1, so a per-rank
    # mean averaged by DDP would differ from the per-token mean over the global window; it does not
    ctx = StudyContext.open(run_dir.parents[1])
    enc = ctx.pipeline.encode_all(ctx.split("train"))
    counts = [
        sum(enc[i].n_supervised for idx in window_at(24, 2, 2, 3, 0, world_size=2, rank=r) for i in idx) for r in (0, 1)
    ]
    assert counts[0] != counts[1]
    assert sum(counts) == metrics(run_dir)[1]["supervised_tokens"]


def test_fsdp2_step_equals_single_process_and_saves_whole_adapter(reference, tiny_base, tmp_path):
    run_dir = _distributed(tiny_base, tmp_path / "fsdp", "fsdp")
    _assert_equivalent(run_dir, reference, "fsdp")
    assert "FSDP2: 2 block units (LlamaDecoderLayer) + root" in (run_dir / "rank-1.log").read_text()
    shapes = (run_dir / "save_check.json").read_text()
    assert '"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": [\n      4,\n      32\n    ]' in shapes
