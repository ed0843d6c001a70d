"""Training health (docs/CASES.md C19): every rule of ``training/health.py`` fires on a tiny Llama
+ LoRA at a known step, and a diverged run is recorded invalid with the rule and its step, never
"completed"."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from tiny_study import make_study, rows
from tuneproof.context import StudyContext
from tuneproof.recipes.train import run_train
from tuneproof.training import health as H
from tuneproof.training.health import HealthFault, HealthMonitor
from tuneproof.training.loop import seed_everything, train


@pytest.fixture(scope="module")
def ctx(tiny_base, tmp_path_factory):
    # 24 examples, micro-batch 4 x accumulation 2, 8 steps, no warmup (step 1 uses the full learning rate)
    return StudyContext.open(make_study(tmp_path_factory.mktemp("health") / "s", tiny_base, warmup_steps=0))


def _train(ctx, model, **cfg):
    device, _, autocast = ctx.torch_setup()
    encoded = ctx.pipeline.encode_all(ctx.split("train"))
    tcfg = ctx.study.training.model_copy(update=cfg)
    return train(model, encoded, tcfg, pad_id=ctx.tokenizer.pad_token_id, device=device, autocast=autocast)


def _model(ctx):
    seed_everything(ctx.study.training.seed)
    model, _ = ctx.build_model()
    return model


def _fault(ctx, model, **cfg) -> HealthFault:
    with pytest.raises(HealthFault) as err:
        _train(ctx, model, **cfg)
    return err.value


def test_a_healthy_run_passes_every_rule(ctx):
    result = _train(ctx, _model(ctx))
    assert result["steps"] == 8 and result["losses"][-1] < result["losses"][0]
    # a random-init tiny LM starts near ln(V) = ln(36) = 3.58 but with a gradient: not a uniform-loss fault
    assert abs(result["losses"][0] - math.log(36)) < 0.1


def test_nonfinite_loss_at_step_1(ctx):
    model = _model(ctx)
    with torch.no_grad():
        model.get_output_embeddings().weight[0, 0] = float("nan")  # a frozen weight: the loss is NaN
    f = _fault(ctx, model)
    assert (f.rule, f.step, f.detail) == ("nonfinite_loss", 1, "loss is nan")


def test_nonfinite_grad_norm_at_step_3(ctx):
    model = _model(ctx)
    calls = []
    p = next(p for n, p in model.named_parameters() if "lora_B" in n)

    def hook(g):  # accumulation 2: backward passes 5 and 6 are step 3
        calls.append(1)
        return torch.full_like(g, float("inf")) if len(calls) >= 5 else g

    p.register_hook(hook)
    f = _fault(ctx, model)
    assert (f.rule, f.step) == ("nonfinite_grad_norm", 3) and "gradient norm is inf" in f.detail


def test_uniform_loss_without_gradient_at_step_1(ctx):
    model = _model(ctx)
    with torch.no_grad():
        model.get_output_embeddings().weight.zero_()  # every logit 0: uniform prediction, no gradient upstream
    f = _fault(ctx, model)
    assert (f.rule, f.step) == ("uniform_loss", 1)
    assert f"= ln(36) {math.log(36):.6f}" in f.detail and "gradient norm 0" in f.detail


def test_zero_gradient_on_3_consecutive_steps(ctx):
    model = _model(ctx)
    with torch.no_grad():  # attention outputs are 0 whatever q/v do: the q/v LoRA gradients are exactly 0
        for name, p in model.named_parameters():
            if name.endswith("o_proj.weight"):
                p.zero_()
    f = _fault(ctx, model)
    assert (f.rule, f.step) == ("zero_grad", H.ZERO_GRAD_STEPS) == ("zero_grad", 3)
    assert f.detail == "gradient norm 0.0 on 3 consecutive steps (1-3)"


def test_nonfinite_tensor_at_step_2(ctx):
    model = _model(ctx)
    name, p = next((n, p) for n, p in model.named_parameters() if "lora_A" in n)
    steps = []

    def poison(optimizer, args, kwargs):  # the update of step 2 leaves a NaN in one LoRA matrix
        steps.append(1)
        if len(steps) == 2:
            with torch.no_grad():
                p[0, 0] = float("nan")

    handle = register_optimizer_step_post_hook(poison)
    try:
        f = _fault(ctx, model)
    finally:
        handle.remove()
    assert (f.rule, f.step, f.detail, f.numbers["tensor"]) == ("nonfinite_tensor", 2, "nan after the update", name)
    assert str(f).startswith(f"step 2: nonfinite_tensor: nan after the update in trainable tensor {name}")


def test_c19_lr_1e30_run_is_invalid_with_rule_and_step(tiny_base, tmp_path):
    study = make_study(tmp_path / "s", tiny_base, learning_rate=1e30, warmup_steps=0)
    c = StudyContext.open(study)
    with pytest.raises(HealthFault):
        run_train(c)
    (rec,) = c.registry.list(kind="train")
    assert rec.status == "invalid"
    assert rec.reason == "step 1: exploded_tensor: max |value| 1e+30 > limit 1e+04 after the update"
    h = rec.summary["health"]
    assert (h["rule"], h["step"]) == ("exploded_tensor", 1) and h["thresholds"]["explode_max_abs"] == 1e4
    assert "lora_B" in h["tensor"] and h["max_abs"] == pytest.approx(1e30, rel=1e-3)
    assert (
        json.loads((c.registry.runs_dir / rec.id / "summary.json").read_text())["health"]["rule"] == "exploded_tensor"
    )
    (row,) = [r for r in rows(c.registry.runs_dir / rec.id) if "loss" in r]
    assert row["step"] == 1 and row["health"] == "exploded_tensor"
    # the adapter values docs/CASES.md C19 saw: ~1e30, the loss still finite
    assert row["max_abs"] == pytest.approx(1e30, rel=1e-3)
    assert math.isfinite(row["loss"]) and row["grad_norm"] > 0
    assert not (c.registry.runs_dir / rec.id / "adapter").exists()  # nothing delivered from an invalid run


def test_monitor_rules_on_numbers():
    w = torch.nn.Parameter(torch.full((2, 2), 1000.0))
    b = torch.nn.Parameter(torch.zeros(3))
    m = HealthMonitor([("w", w), ("b", b)])
    assert m.limits == [1e5, 1e4]  # max(1e4, 100 x initial max |value|)
    ln = math.log(10)
    m.before_update(1, ln, 0.5, 10)  # at ln(V) but with a gradient: fine
    m.before_update(2, ln + 0.01, 0.0, 10)  # no gradient but not at ln(V): zero streak 1
    m.before_update(3, 2.0, 0.0, 10)  # streak 2
    m.before_update(4, 2.0, 1e-3, 10)  # a gradient again: streak reset
    m.before_update(5, 2.0, 0.0, 10)
    m.before_update(6, 2.0, 0.0, 10)
    with pytest.raises(HealthFault, match="step 7: zero_grad: gradient norm 0.0 on 3 consecutive steps"):
        m.before_update(7, 2.0, 0.0, 10)
    with pytest.raises(HealthFault, match="step 1: uniform_loss"):
        HealthMonitor([]).before_update(1, ln + 5e-4, 1e-7, 10)
    assert m.after_update(8) == 1000.0
    with torch.no_grad():
        b[0] = 2e4
    with pytest.raises(
        HealthFault,
        match=r"step 9: exploded_tensor: max \|value\| 2e\+04 > limit 1e\+04 after the update in trainable tensor b",
    ):
        m.after_update(9)
    with torch.no_grad():
        w[0, 0] = 5e4  # under its own limit 1e5
        b[0] = float("inf")
    with pytest.raises(HealthFault, match="step 10: nonfinite_tensor: inf after the update in trainable tensor b"):
        m.after_update(10)


def test_grad_norm_is_measured_without_clipping_and_clips_with():
    p = torch.nn.Parameter(torch.zeros(2))
    p.grad = torch.tensor([3.0, 4.0])
    assert H.grad_norm([p], None) == 5.0 and p.grad.tolist() == [3.0, 4.0]
    assert H.grad_norm([p], 1.0) == 5.0 and p.grad.norm().item() == pytest.approx(1.0, abs=1e-6)
    assert H.grad_norm([torch.nn.Parameter(torch.zeros(1))], 1.0) == 0.0  # no gradient at all
