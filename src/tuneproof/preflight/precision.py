"""Preflight checks of the numeric precision: ``precision`` (the chosen 16-bit dtype under autocast vs
fp32 on one real micro-batch) and ``bf16 base weights`` (``training.bf16_base_weights``: the frozen
weights held in bf16 vs fp32)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

import torch

from tuneproof.context import StudyContext
from tuneproof.data.preprocess import collate
from tuneproof.preflight.report import check_result, to_gib
from tuneproof.preflight.update_check import batch_loss
from tuneproof.training.loop import _micro_loss
from tuneproof.training.speedups import check_bf16_base

#: Precision check: the loss in the chosen 16-bit dtype within 2% of fp32 and the gradient
#: direction (cosine over every trainable element) >= 0.98. bf16 keeps 8 significant bits
#: (relative rounding 2**-8 = 0.4% per operation); these bounds leave room for accumulation
#: over a few hundred operations while catching overflow, underflow and wrong casts.
PRECISION_LOSS_RTOL = 0.02
PRECISION_GRAD_COSINE = 0.98


def check_precision(model, batch: dict, choice: dict[str, Any], autocast: Callable) -> dict[str, Any]:
    """The chosen dtype (``choice["dtype"]``) on its own: loss and gradients under ``autocast`` vs fp32
    on one real micro-batch ``batch``, without dropout; fp32 is the reference and needs no comparison."""
    dtype = choice["dtype"]
    if dtype == "fp32":
        return check_result(
            "precision",
            True,
            f"fp32 (the reference precision): nothing to compare; {choice['reason']}",
            {"dtype": "fp32"},
        )
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    was_training = model.training
    runs = {}
    try:
        model.eval()  # no dropout: both passes compute the same function
        for name, factory in (("fp32", contextlib.nullcontext), (dtype, autocast)):
            for _, p in params:
                p.grad = None
            with factory():
                loss = batch_loss(model, batch)
            loss.backward()
            filled = [p.grad if p.grad is not None else torch.zeros_like(p) for _, p in params]
            grads = torch.cat([g.detach().float().reshape(-1).cpu() for g in filled])
            runs[name] = (float(loss.detach()), grads)
    finally:
        for _, p in params:
            p.grad = None
        model.train(was_training)
    (l32, g32), (llp, glp) = runs["fp32"], runs[dtype]
    finite = math.isfinite(llp) and bool(torch.isfinite(glp).all())
    rel = abs(llp - l32) / max(abs(l32), 1e-12)
    cos = float(torch.nn.functional.cosine_similarity(g32, glp, dim=0)) if finite else float("nan")
    passed = finite and rel <= PRECISION_LOSS_RTOL and cos >= PRECISION_GRAD_COSINE
    numbers = {
        "dtype": dtype,
        "loss_fp32": round(l32, 6),
        f"loss_{dtype}": round(llp, 6),
        "loss_rel_diff": rel,
        "grad_cosine": cos,
        "loss_rtol": PRECISION_LOSS_RTOL,
        "min_cosine": PRECISION_GRAD_COSINE,
    }
    message = (
        f"{dtype} vs fp32 on {int(batch['input_ids'].shape[0])} examples: loss {llp:.5g} vs {l32:.5g} "
        f"(rel. diff {rel:.2e}, limit {PRECISION_LOSS_RTOL}), gradient cosine {cos:.5f} "
        f"(min {PRECISION_GRAD_COSINE})"
    )
    if not finite:
        message = f"{dtype}: non-finite loss or gradients ({llp}); set training.precision to fp32 or bf16"
    return check_result("precision", passed, message, numbers)


def check_bf16_base_weights(ctx: StudyContext, model, usable: list, pad: int, autocast: Callable) -> dict[str, Any]:
    """``training.bf16_base_weights``: on the configured micro-batch of real train examples, the loss
    and trained gradients with the frozen weights in bf16 equal those with them in fp32 within the
    stated tolerances (:func:`tuneproof.training.speedups.check_bf16_base`), with the peak memory of
    a forward + backward with each; when it passes the model keeps its bf16 frozen weights for every
    later check, as training will (when it fails, they are put back in fp32)."""
    cfg = ctx.study.training
    device, _, _ = ctx.torch_setup()
    batch = {k: v.to(device) for k, v in collate(usable[: cfg.micro_batch_size], pad).items()}
    r = check_bf16_base(model, batch, lambda m, b: _micro_loss(m, b, autocast, cfg.chunked_loss), device=device)
    mem = r["memory"]
    numbers = {
        "loss_fp32": round(r["loss_fp32"], 6),
        "loss_bf16": round(r["loss_bf16"], 6),
        "loss_rel_diff": r["loss_rel_diff"],
        "grad_rel_l2": r["grad_rel_l2"],
        "grad_cosine": r["grad_cosine"],
        "tensors": r["tensors"],
        "cast_tensors": r["cast"].get("cast_tensors"),
        "bytes_saved_mib": round(r["cast"].get("bytes_saved", 0) / 2**20, 2),
        "fp32_frozen_peak_gib": to_gib(mem["fp32_frozen_peak_bytes"]),
        "bf16_frozen_peak_gib": to_gib(mem["bf16_frozen_peak_bytes"]),
        **{f"limit_{k}": v for k, v in r["tolerance"].items()},
    }
    return check_result("bf16 base weights", bool(r["passed"]), r["message"], numbers, r)
