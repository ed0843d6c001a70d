"""docs/CASES.md C12 and the checkpoint's contents.

docs/CASES.md C12: a LoRA run with 5 warmup steps stopped after global step 10, saved, then restored into freshly
built objects (model from the base folder, new optimizer and scheduler, as a new process does):
global step 10, the next learning rate is the schedule's value for step 11, the adapter weights
and optimizer moments equal the saved ones exactly, the resumed run's first loss is close to the
last saved one (not a fresh adapter's).
"""

from __future__ import annotations

import pytest
import torch

from tiny_study import losses_by_step, make_study, rows
from tuneproof.cli import main
from tuneproof.context import StudyContext
from tuneproof.io import read_json
from tuneproof.recipes.train import TrainOptions, run_train
from tuneproof.registry import Registry
from tuneproof.training.loop import seed_everything
from tuneproof.training.resume_state import list_checkpoints, load_checkpoint, restore_state

LR, WARMUP, TOTAL = 0.05, 5, 16


@pytest.fixture(scope="module")
def stopped(tiny_base, tmp_path_factory):
    """Trained 10 of 16 steps (warmup 5, linear decay) and stopped as if interrupted."""
    study = make_study(
        tmp_path_factory.mktemp("c12") / "s",
        tiny_base,
        max_steps=TOTAL,
        warmup_steps=WARMUP,
        learning_rate=LR,
        checkpoint_every=4,
        gradient_accumulation_steps=1,
    )
    ctx = StudyContext.open(study)
    with pytest.raises(KeyboardInterrupt):
        run_train(ctx, TrainOptions(stop_after=10))
    (rec,) = ctx.registry.list(kind="train")
    return study, rec


def schedule(step: int) -> float:
    """transformers' linear schedule with warmup, for 0-based optimizer step ``step``."""
    if step < WARMUP:
        return LR * step / WARMUP
    return LR * max(0.0, (TOTAL - step) / (TOTAL - WARMUP))


def test_checkpoint_holds_everything_to_resume_and_explain(stopped):
    study, rec = stopped
    assert rec.status == "interrupted" and rec.reason == "interrupted (stop_after=10) at step 10"
    run_dir = Registry(study).runs_dir / rec.id
    files = list_checkpoints(run_dir)
    assert [p.name for p in files] == ["step-000008", "step-000010"]  # periodic (every 4; step 4 pruned) + interruption
    assert not [p for p in (run_dir / "checkpoints").iterdir() if p.name.startswith(".")]  # no temp file left
    ckpt = load_checkpoint(files[-1])
    assert ckpt["step"] == 10 and ckpt["total_steps"] == TOTAL and ckpt["reason"] == "interrupt"
    names = sorted(ckpt["trainable"])
    assert len(names) == 8 and all(".lora_A." in n or ".lora_B." in n for n in names)  # adapter only, no base weight
    state = ckpt["optimizer"]["state"]
    assert len(state) == 8 and all(
        int(s["step"]) == 10 and "exp_avg" in s and "exp_avg_sq" in s for s in state.values()
    )
    assert ckpt["scheduler"]["last_epoch"] == 10
    assert set(ckpt["rng"]) >= {"python", "numpy", "torch"}
    assert ckpt["data"] == {
        "n_examples": 24,
        "micro_batch": 4,
        "accumulation": 1,
        "seed": 3,
        "next_micro_batch": 10,
        "epoch": 1,
        "steps_per_epoch": 6,
        "order": ckpt["data"]["order"],
        "world_size": 1,
    }
    assert ckpt["config"] == read_json(run_dir / "config.json")
    assert ckpt["data_fingerprint"] == rec.data_fingerprint
    assert ckpt["base_revision"].startswith("sha256:")
    assert len(ckpt["losses"]) == 10 and ckpt["losses"] == pytest.approx(
        list(losses_by_step(run_dir).values()), abs=1e-6
    )


def test_c12_restore_into_fresh_objects_is_exact(stopped):
    from transformers import get_scheduler

    study, rec = stopped
    run_dir = Registry(study).runs_dir / rec.id
    ckpt = load_checkpoint(list_checkpoints(run_dir)[-1])
    ctx = StudyContext.open(study, config=ckpt["config"])
    seed_everything(123)  # another initialisation than the run's
    model, _ = ctx.build_model()
    named = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert all(not named[n].any() for n in named if ".lora_B." in n)  # a fresh adapter
    params = list(named.values())
    optimizer = torch.optim.AdamW(params, lr=LR)
    scheduler = get_scheduler("linear", optimizer, num_warmup_steps=WARMUP, num_training_steps=TOTAL)
    restore_state(model, optimizer, scheduler, ckpt)

    for name, tensor in ckpt["trainable"].items():
        assert torch.equal(named[name].detach(), tensor), name
    assert any(named[n].abs().sum() > 0 for n in named if ".lora_B." in n)  # not the fresh adapter any more
    saved = ckpt["optimizer"]["state"]
    restored = optimizer.state_dict()["state"]
    for i, s in saved.items():
        assert torch.equal(restored[i]["exp_avg"], s["exp_avg"]) and torch.equal(
            restored[i]["exp_avg_sq"], s["exp_avg_sq"]
        )
        assert int(restored[i]["step"]) == 10
    assert scheduler.last_epoch == 10
    # the learning rate of step 11 (0-based index 10): 0.05 * (16 - 10) / (16 - 5)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(schedule(10), rel=1e-12)
    assert schedule(10) == pytest.approx(LR * 6 / 11)


def test_c12_resume_continues_at_step_11(stopped, tmp_path):
    import shutil

    study = shutil.copytree(stopped[0], tmp_path / "s")
    rec = stopped[1]
    run_dir = study / "runs" / rec.id
    with pytest.raises(SystemExit) as exit_:
        main(["resume", rec.id, "--study", str(study)])
    assert exit_.value.code == 0
    assert Registry(study).get(rec.id).status == "completed"
    metric_rows = [r for r in rows(run_dir) if "loss" in r]
    assert [r["step"] for r in metric_rows] == list(range(1, TOTAL + 1))
    by_step = {r["step"]: r for r in metric_rows}
    for step in (1, 5, 10, 11, 16):  # the learning rate each step used
        assert by_step[step]["lr"] == pytest.approx(schedule(step - 1), rel=1e-9, abs=1e-15)
    first, last_saved, resumed = by_step[1]["loss"], by_step[10]["loss"], by_step[11]["loss"]
    # the resumed loss continues from the trained adapter, far from a fresh adapter's starting loss
    assert first - last_saved > 0.15
    assert abs(resumed - last_saved) < 0.25 * (first - last_saved)
