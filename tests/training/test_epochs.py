"""Step budget (docs/CASES.md C18): ``training.max_steps`` and ``training.epochs`` are exclusive,
the run says which key set its budget, and an accumulation window never crosses an epoch
boundary: the last window of an epoch holds what is left and its gradient equals the gradient of
those examples concatenated. Resume exactly at an epoch boundary is exact."""

from __future__ import annotations

import pytest
import torch
import yaml
from torch.optim.optimizer import register_optimizer_step_pre_hook

from tiny_study import adapter_tensors, losses_by_step, make_study, rows, study_config
from tuneproof.context import StudyContext, parse_study
from tuneproof.data.preprocess import collate
from tuneproof.errors import TuneproofError
from tuneproof.recipes.resume import run_resume
from tuneproof.recipes.train import TrainOptions, run_train
from tuneproof.study import Training
from tuneproof.training.budget import budget, optimizer_steps_per_epoch
from tuneproof.training.data_order import epoch_order, window_at, window_position
from tuneproof.training.loss import token_loss_sum
from tuneproof.training.resume_state import latest_checkpoint, load_checkpoint


def test_max_steps_and_epochs_are_exclusive(tiny_base):
    raw = study_config(tiny_base, max_steps=4, epochs=1)
    with pytest.raises(TuneproofError) as err:
        parse_study(raw, "s/tuneproof.yaml")
    first = str(err.value).splitlines()[0]
    assert first == (
        "s/tuneproof.yaml: training: training.max_steps (4) and training.epochs (1) are both set: "
        "the step budget comes from one of them; remove one (or set it to null)"
    )
    with pytest.raises(TuneproofError, match="training.max_steps .3. and training.epochs .2. are both set"):
        budget(Training().model_copy(update={"max_steps": 3, "epochs": 2}), 10)  # built without validation


def test_budget_says_which_key_set_it():
    # 10 examples, micro-batch 2 -> 5 micro-batches per epoch; accumulation 2 -> windows of 2, 2, 1: 3 steps per epoch
    base = {"micro_batch_size": 2, "gradient_accumulation_steps": 2}
    assert budget(Training(**base), 10) == {
        "key": "default",
        "value": 1,
        "total_steps": 3,
        "steps_per_epoch": 3,
        "micro_batches_per_epoch": 5,
        "examples_per_epoch": 10,
    }
    assert Training().max_steps is None and Training().epochs is None  # no silent 100-step default
    b = budget(Training(**base, epochs=2), 10)
    assert (b["key"], b["value"], b["total_steps"]) == ("training.epochs", 2, 6)
    assert budget(Training(**base, epochs=1.5), 10)["total_steps"] == 5  # ceil(1.5 x 3)
    b = budget(Training(**base, max_steps=7), 10)
    assert (b["key"], b["value"], b["total_steps"]) == ("training.max_steps", 7, 7)


def test_windows_stay_inside_an_epoch():
    # docs/CASES.md C18 shape: 6 examples, micro-batch 1, accumulation 4 -> windows of 4 and 2 micro-batches
    assert optimizer_steps_per_epoch(6, 1, 4) == 2
    assert [len(window_at(6, 1, 4, 0, s)) for s in range(4)] == [4, 2, 4, 2]
    for epoch in (0, 1):
        flat = [i for s in (2 * epoch, 2 * epoch + 1) for mb in window_at(6, 1, 4, 0, s) for i in mb]
        assert flat == epoch_order(6, seed=0, epoch=epoch)  # each epoch exactly once, in the sampler's order
    assert window_position(6, 1, 4, 1) == {"epoch": 0, "window": 1, "first_micro_batch": 4, "micro_batches": 2}
    assert window_position(6, 1, 4, 2) == {"epoch": 1, "window": 0, "first_micro_batch": 6, "micro_batches": 4}
    # per process with DistributedSampler semantics: 10 examples over 2 processes, micro-batch 2, accumulation 2:
    # 5 examples each -> 3 micro-batches -> windows of 2 and 1
    assert optimizer_steps_per_epoch(10, 2, 2, world_size=2) == 2
    share = epoch_order(10, world_size=2, rank=1, seed=0, epoch=0)
    assert window_at(10, 2, 2, 0, 1, world_size=2, rank=1) == [share[4:5]]


def _study(folder, base, dropout: float, **training):
    study = make_study(folder, base, **training)
    raw = yaml.safe_load((study / "tuneproof.yaml").read_text())
    raw["method"]["dropout"] = dropout
    (study / "tuneproof.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    return study


def test_c18_last_window_holds_the_rest_of_the_epoch(tiny_base, tmp_path):
    study = _study(
        tmp_path / "s",
        tiny_base,
        0.0,
        n_train=6,
        max_steps=None,
        epochs=1,
        micro_batch_size=1,
        gradient_accumulation_steps=4,
        warmup_steps=0,
        max_grad_norm=None,
    )
    ctx = StudyContext.open(study)
    seen = []  # per optimizer step: (weights before the update, gradients of the update)

    def grab(optimizer, args, kwargs):
        ps = [p for g in optimizer.param_groups for p in g["params"]]
        seen.append(([p.detach().clone() for p in ps], [p.grad.detach().clone() for p in ps]))

    handle = register_optimizer_step_pre_hook(grab)
    try:
        rid = run_train(ctx)
    finally:
        handle.remove()
    rec = ctx.registry.get(rid)
    assert rec.status == "completed" and rec.summary["steps"] == 2  # not 100 (the old max_steps default)
    assert rec.summary["example_passes"] == 6  # not 8: update 2 takes nothing from epoch 2
    b = rec.summary["budget"]
    assert (b["key"], b["value"], b["total_steps"], b["steps_per_epoch"]) == ("training.epochs", 1, 2, 2)
    steps = [r for r in rows(ctx.registry.runs_dir / rid) if "loss" in r]
    assert [(r["step"], r["epoch"], r["micro_batches"], r["examples"]) for r in steps] == [(1, 0, 4, 4), (2, 0, 2, 2)]

    # the gradient of update 2 vs the gradient of its 2 examples concatenated, at the same weights
    weights, grads = seen[1]
    seed = ctx.study.training.seed
    idx = [i for mb in window_at(6, 1, 4, seed, 1) for i in mb]
    assert idx == epoch_order(6, seed=seed, epoch=0)[4:]
    model, _ = ctx.build_model()
    params = [p for p in model.parameters() if p.requires_grad]
    with torch.no_grad():
        for p, w in zip(params, weights):
            p.copy_(w)
    encoded = ctx.pipeline.encode_all(ctx.split("train"))
    batch = collate([encoded[i] for i in idx], ctx.tokenizer.pad_token_id)
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    n_tokens = int((batch["labels"][:, 1:] != -100).sum())
    assert n_tokens == steps[1]["supervised_tokens"]
    loss = token_loss_sum(logits, batch["labels"]) / n_tokens
    assert float(loss.detach()) == pytest.approx(steps[1]["loss"], abs=1e-6)
    loss.backward()
    loop = torch.cat([g.flatten() for g in grads])
    cat = torch.cat([p.grad.flatten() for p in params])
    assert float(loop.norm() / cat.norm()) == pytest.approx(1.0, abs=1e-5)  # not 0.5 (divided as if 4 micro-batches)
    assert torch.allclose(loop, cat, rtol=1e-4, atol=1e-7)
    assert steps[1]["grad_norm"] == pytest.approx(float(cat.norm()), rel=1e-5)


def test_resume_exactly_at_an_epoch_boundary_is_exact(tiny_base, tmp_path):
    # 10 examples, micro-batch 2, accumulation 2: windows of 2, 2, 1 -> 3 steps per epoch, 2 epochs; dropout on
    training = dict(
        n_train=10,
        max_steps=None,
        epochs=2,
        micro_batch_size=2,
        gradient_accumulation_steps=2,
        warmup_steps=1,
        checkpoint_every=2,
    )
    ref_study = _study(tmp_path / "ref", tiny_base, 0.1, **training)
    ref_ctx = StudyContext.open(ref_study)
    ref_id = run_train(ref_ctx)
    ref_dir = ref_ctx.registry.runs_dir / ref_id
    ref_ckpt = load_checkpoint(latest_checkpoint(ref_dir))
    assert ref_ckpt["step"] == 6 and len(ref_ckpt["losses"]) == 6

    study = _study(tmp_path / "s", tiny_base, 0.1, **training)
    ctx = StudyContext.open(study)
    with pytest.raises(KeyboardInterrupt):
        run_train(ctx, TrainOptions(stop_after=3))  # the end of epoch 0
    (rec,) = ctx.registry.list(kind="train")
    ckpt = load_checkpoint(latest_checkpoint(ctx.registry.runs_dir / rec.id))
    assert (ckpt["step"], ckpt["data"]["epoch"], ckpt["data"]["next_micro_batch"], ckpt["data"]["steps_per_epoch"]) == (
        3,
        1,
        5,
        3,
    )
    assert ckpt["examples_seen"] == 10
    ctx.registry.close()
    run_resume(study, None, rec.id)
    run_dir = ctx.registry.runs_dir / rec.id
    final = load_checkpoint(latest_checkpoint(run_dir))
    assert final["losses"] == ref_ckpt["losses"]  # bit-identical, every step
    assert final["examples_seen"] == 20
    assert losses_by_step(run_dir) == losses_by_step(ref_dir)
    got, want = adapter_tensors(run_dir), adapter_tensors(ref_dir)
    assert sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want)
    assert [r["micro_batches"] for r in rows(run_dir) if "loss" in r] == [2, 2, 1, 2, 2, 1]


def test_preflight_accumulation_check_covers_the_short_last_window(tiny_base, tmp_path):
    from tuneproof.preflight.accumulation import check_accumulation_window, last_window_probe

    study = _study(
        tmp_path / "s", tiny_base, 0.1, n_train=10, max_steps=None, micro_batch_size=2, gradient_accumulation_steps=2
    )
    ctx = StudyContext.open(study)
    encoded = ctx.pipeline.encode_all(ctx.split("train"))
    cfg, pad = ctx.study.training, ctx.tokenizer.pad_token_id
    last = last_window_probe(encoded, cfg, 1, pad)  # epoch of 5 micro-batches: windows 2, 2, 1
    (only,) = window_at(10, 2, 2, cfg.seed, 2)
    assert len(last) == 1 and last[0]["input_ids"].shape[0] == 1
    assert last[0]["input_ids"][0].tolist()[: len(encoded[only[0]].input_ids)] == encoded[only[0]].input_ids
    model, _ = ctx.build_model()
    first = [collate([encoded[i]], pad) for i in (0, 1)]
    c = check_accumulation_window(model, first, 2, last)
    assert c["passed"], c["message"]
    assert c["numbers"]["last_window_micro_batches"] == 1 and "last window of an epoch (1 micro-batch, " in c["message"]
    # 2 micro-batches: full
    assert last_window_probe(encoded, cfg.model_copy(update={"micro_batch_size": 5}), 1, pad) is None
