"""Preflight checks ``configured combination``, ``smoke pass`` and ``throughput``: two real steps of the
training loop with every configured option together, a small evaluation by the study's procedure,
the adapter (or full model) saved and reloaded in a fresh process (:mod:`tuneproof.preflight.reload`)
that predicts the same examples, and the throughput of those steps (read by ``tuneproof plan``)."""

from __future__ import annotations

import math
import time
from typing import Any

from tuneproof.context import StudyContext
from tuneproof.evaluation.predict import predict
from tuneproof.preflight.eval_memory import eval_batch_rate
from tuneproof.preflight.reload import RELOAD_LOGIT_ATOL, RELOAD_LOGIT_ATOL_LOW_PRECISION, reload_in_fresh_process
from tuneproof.preflight.report import PreflightReport, check_result
from tuneproof.preflight.update_check import same_bits
from tuneproof.training.budget import total_steps
from tuneproof.training.data_order import window_at
from tuneproof.training.loop import train

SMOKE_CHECKS = ("configured combination", "smoke pass", "throughput")
SMOKE_STEPS = 2  # optimizer steps of the smoke pass (also the configured-combination check)
SMOKE_EVAL_EXAMPLES = 2  # evaluation examples of the smoke pass (predicted, reloaded, predicted again)


def cpu_copy(model) -> dict[str, Any]:
    """Every parameter of ``model`` copied to the CPU (name -> tensor)."""
    return {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters()}


def check_smoke(ctx: StudyContext, run, model, encoded: list, report: PreflightReport) -> dict[str, Any]:
    """Checks 10-12: two real steps of the training loop with the configured options, a small
    evaluation, save, reload in a fresh process, identical outputs; throughput from those steps.
    Adds the checks ``configured combination``, ``smoke pass`` and ``throughput`` to ``report``."""
    cfg = ctx.study.training
    device, _, autocast = ctx.torch_setup()
    # a copy of the config: 2 steps at the peak learning rate (with warmup the first step would use lr 0)
    scfg = cfg.model_copy(
        update={"max_steps": SMOKE_STEPS, "epochs": None, "warmup_steps": 0, "lr_scheduler": "constant"}
    )
    before = cpu_copy(model)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    frozen = [n for n in before if n not in trainable]
    marks = [time.perf_counter()]
    result = train(
        model,
        encoded,
        scfg,
        pad_id=getattr(ctx.tokenizer, "pad_token_id", 0) or 0,
        device=device,
        autocast=autocast,
        progress=lambda s, t, loss: marks.append(time.perf_counter()),
    )
    step_s = [b - a for a, b in zip(marks, marks[1:])]
    after = cpu_copy(model)
    not_changed = sorted(n for n in trainable if same_bits(before[n], after[n]))
    frozen_changed = [n for n in frozen if not same_bits(before[n], after[n])]
    del before, after
    losses = result["losses"]
    finite = all(math.isfinite(x) for x in losses)
    combo_ok = finite and not not_changed and not frozen_changed and result["steps"] == SMOKE_STEPS
    combo_numbers = {
        "micro_batch": cfg.micro_batch_size,
        "accumulation": cfg.gradient_accumulation_steps,
        "activation_checkpointing": cfg.activation_checkpointing,
        "dtype": ctx.device_choice["dtype"],
        "steps": result["steps"],
        "losses": [round(x, 6) for x in losses],
        "trainable_changed": len(trainable) - len(not_changed),
        "trainable_tensors": len(trainable),
        "frozen_unchanged": len(frozen) - len(frozen_changed),
        "frozen_tensors": len(frozen),
    }
    combo_msg = (
        f"{result['steps']} steps of training.loop.train with micro-batch {cfg.micro_batch_size} "
        f"x accumulation {cfg.gradient_accumulation_steps}, activation checkpointing "
        f"{'on' if cfg.activation_checkpointing else 'off'}, "
        f"{ctx.device_choice['dtype']}: losses {', '.join(f'{x:.4f}' for x in losses)}; "
        f"{combo_numbers['trainable_changed']} of {len(trainable)} trainable tensors changed, "
        f"{combo_numbers['frozen_unchanged']} of {len(frozen)} frozen bitwise unchanged"
    )
    if not finite:
        combo_msg = f"non-finite loss in the configured combination ({losses}); " + combo_msg
    if not_changed:
        combo_msg += f"; not changed: {', '.join(not_changed[:5])}"
    if frozen_changed:
        combo_msg += f"; frozen tensors changed: {', '.join(frozen_changed[:5])}"
    report.add(
        check_result(
            "configured combination",
            combo_ok,
            combo_msg,
            combo_numbers,
            {"not_changed": not_changed, "frozen_changed": frozen_changed, "normalisation": result["normalisation"]},
        )
    )

    # evaluation on a small subset, by the study's procedure
    examples = ctx.eval_examples()[:SMOKE_EVAL_EXAMPLES]
    t0 = time.perf_counter()
    preds = predict(ctx, model, examples, "smoke eval")
    eval_s = time.perf_counter() - t0
    scores = ctx.modality.scores(ctx, model, examples)
    adapter_effect = None
    if ctx.study.method.kind in ("lora", "qlora") and ctx.head.adapter_effect:
        with model.disable_adapter():
            base_scores = ctx.modality.scores(ctx, model, examples)
        adapter_effect = max(
            (abs(a[1] - b[1]) for s, bs in zip(scores, base_scores) for a, b in zip(s, bs)), default=0.0
        )
    # save: the adapter (PEFT layout) or the full model
    smoke = run.dir / "smoke"
    payload_kind = "model" if ctx.study.method.kind == "full" else "adapter"
    payload = smoke / payload_kind
    model.save_pretrained(payload, safe_serialization=True)
    saved_files = sorted(p.name for p in payload.iterdir())
    # reload in a fresh process and predict the same examples
    child = reload_in_fresh_process(ctx, smoke, payload, payload_kind, examples)
    mismatches = [
        {"id": e.id, "before": a, "after": b} for e, a, b in zip(examples, preds, child["predictions"]) if a != b
    ]
    ids_differ = [e.id for e, s, c in zip(examples, scores, child["scores"]) if [i for i, _ in s] != [i for i, _ in c]]
    logit_diff = max((abs(a[1] - b[1]) for s, c in zip(scores, child["scores"]) for a, b in zip(s, c)), default=0.0)
    tol = RELOAD_LOGIT_ATOL if ctx.device_choice["dtype"] == "fp32" else RELOAD_LOGIT_ATOL_LOW_PRECISION
    smoke_ok = (
        combo_ok
        and not mismatches
        and not ids_differ
        and logit_diff <= tol
        and len(child["predictions"]) == len(examples)
    )
    numbers = {
        "steps": result["steps"],
        "eval_examples": len(examples),
        "eval_seconds": round(eval_s, 3),
        "identical_after_reload": len(examples) - len(mismatches),
        "max_abs_logit_diff": logit_diff,
        "logit_atol": tol,
        "adapter_effect_max_abs_logit": adapter_effect,
        "reload_seconds": round(child["seconds"], 2),
        "saved": f"runs/{run.id}/smoke/{payload_kind}",
    }
    msg = (
        f"{result['steps']} training steps; {len(examples)} evaluation examples predicted in {eval_s:.1f} s; "
        f"saved {payload_kind} ({len(saved_files)} files); reloaded in a fresh process in {child['seconds']:.1f} s: "
        f"{len(examples) - len(mismatches)} of {len(examples)} predictions identical, "
        f"max |{ctx.modality.logit} logit diff| "
        f"{logit_diff:.2e} (tolerance {tol:g})"
    )
    if adapter_effect is not None:
        msg += f"; the adapter moves those logits by up to {adapter_effect:.2e}"
    if mismatches:
        first = mismatches[0]
        msg += f"; differ after reload: {first['id']}: {first['before']!r} -> {first['after']!r}"
    if ids_differ:
        msg += f"; next-token ranking differs after reload for {', '.join(ids_differ[:3])}"
    details = {
        "predictions": preds,
        "reloaded": child["predictions"],
        "scores": scores,
        "reloaded_scores": child["scores"],
        "mismatches": mismatches,
        "saved_files": saved_files,
        "child_load_seconds": child.get("load_seconds"),
        "child_predict_seconds": child.get("predict_seconds"),
    }
    smoke_check = report.add(check_result("smoke pass", smoke_ok, msg, numbers, details))

    # throughput: steps after the first (the first carries one-time allocation costs)
    n = len(encoded)
    accum = cfg.gradient_accumulation_steps

    def step_tokens(step: int) -> int:  # the modality's units: tokens, or images (the rate is then images/s)
        window = window_at(n, cfg.micro_batch_size, accum, cfg.seed, step)
        return sum(ctx.modality.units(encoded[i]) for idx in window for i in idx)

    timed = list(range(1, len(step_s))) or [0]
    secs = sum(step_s[i] for i in timed)
    s_per_step = secs / len(timed)
    tokens_per_s = sum(step_tokens(i) for i in timed) / max(secs, 1e-9)
    steps_total = total_steps(cfg, n)
    n_eval = len(ctx.eval_examples())
    repeat = ctx.study.eval.repeat
    eval_per_ex = eval_s / max(len(examples), 1)
    batch_rate = eval_batch_rate(report.get("eval memory"))
    eval_basis = f"measured on {len(examples)} smoke examples{ctx.modality.smoke_eval_note}"
    if batch_rate:  # one full batch at eval.batch_size: the rate evaluation runs at (batching amortises per-call costs)
        eval_per_ex = batch_rate["eval_batch_s_per_example"]
        eval_basis = (
            f"one batch of {batch_rate['eval_batch_size']} at eval.batch_size "
            f"({batch_rate['eval_batch_procedure']}), timed by the eval memory check"
        )
    tnum = {
        "s_per_step": round(s_per_step, 4),
        "tokens_per_s": round(tokens_per_s, 1),
        "micro_batch": cfg.micro_batch_size,
        "accumulation": accum,
        "total_steps": steps_total,
        "budget_seconds": round(steps_total * s_per_step, 1),
        "eval_s_per_example": round(eval_per_ex, 4),
        "eval_examples": n_eval,
        "eval_seconds_estimate": round(eval_per_ex * n_eval * repeat, 1),  # every repeat of eval.repeat
        "step_seconds": [round(x, 3) for x in step_s],
    }
    report.add(
        check_result(
            "throughput",
            True,
            f"{s_per_step:.2f} s/step, {tokens_per_s:.0f} {ctx.modality.unit}/s at micro-batch "
            f"{cfg.micro_batch_size} x {accum} (timed on step{'s' if len(timed) > 1 else ''} "
            f"{', '.join(str(i + 1) for i in timed)} of {len(step_s)}); the budget of "
            f"{steps_total} steps takes about {hms(steps_total * s_per_step)}; "
            f"one evaluation of {n_eval} examples"
            + (f" x {repeat} repeats (eval.repeat)" if repeat > 1 else "")
            + f" about {hms(eval_per_ex * n_eval * repeat)} ({eval_per_ex:.3g} s per example, {eval_basis})",
            tnum,
        )
    )
    return smoke_check


def hms(seconds: float) -> str:
    """A duration for messages: ``1 h 02 min``, ``3 min 05 s`` or ``42 s``."""
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h} h {m:02d} min" if h else (f"{m} min {s:02d} s" if m else f"{s} s")
