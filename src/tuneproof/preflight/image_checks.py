"""Preflight checks an image classifier needs in place of the text ones that depend on sequence
length: the step and evaluation-batch memory on real images at the configured sizes, and that
predictions do not depend on the evaluation batch size (docs/CASES.md C22, for a forward pass)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tuneproof.modalities.image import classify_images
from tuneproof.preflight.report import to_gib
from tuneproof.training.memory import measure_step_peak


def check_image_step_memory(model, batch: dict[str, torch.Tensor], budget: int, autocast: Callable) -> dict[str, Any]:
    """Peak memory of one whole step (forward, loss, backward, AdamW) at the configured
    micro-batch of real images, against ``budget`` (bytes); the weights are restored afterwards.

    Returns ``{"passed", "message", "numbers": {"micro_batch", "image_shape", "step_peak_gib", "budget_gib"}}``.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    saved = [p.detach().clone() for p in params]
    opt = torch.optim.AdamW(params, lr=1e-8)

    def step():
        with autocast():
            loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    m = measure_step_peak(step)
    with torch.no_grad():
        for p, s in zip(params, saved):
            p.copy_(s)
    peak = int(m.get("step_peak_bytes") or 0)
    shape = list(batch["pixel_values"].shape)
    passed = peak <= budget
    return {
        "passed": passed,
        "message": f"one step at micro-batch {shape[0]} of {shape[1:]} images: {peak / 2**30:.3f} GiB measured"
        f" ({m['method'].split(' (')[0]}), budget {budget / 2**30:.1f} GiB"
        + ("" if passed else ": lower training.micro_batch_size"),
        "numbers": {
            "micro_batch": shape[0],
            "image_shape": shape[1:],
            "step_peak_gib": to_gib(peak),
            "budget_gib": to_gib(budget),
        },
    }


def check_image_eval_memory(model, batch: dict[str, torch.Tensor], budget: int, autocast: Callable) -> dict[str, Any]:
    """Peak memory of one evaluation forward pass at ``eval.batch_size`` images (inference mode)."""
    was = model.training
    model.eval()

    def forward():
        with torch.inference_mode(), autocast():
            model(pixel_values=batch["pixel_values"])

    try:
        m = measure_step_peak(forward)
    finally:
        model.train(was)
    peak = int(m.get("step_peak_bytes") or 0)
    n = int(batch["pixel_values"].shape[0])
    passed = peak <= budget
    return {
        "passed": passed,
        "message": f"one evaluation batch of {n} images (eval.batch_size): {peak / 2**30:.3f} GiB measured, "
        f"budget {budget / 2**30:.1f} GiB" + ("" if passed else ": lower eval.batch_size"),
        "numbers": {"batch_size": n, "eval_peak_gib": to_gib(peak), "budget_gib": to_gib(budget)},
    }


def check_image_eval_batch(
    model, pipeline, examples: list, labels: list[str], batch_size: int, device, autocast
) -> dict[str, Any]:
    """docs/CASES.md C22 for images: predictions at ``eval.batch_size`` equal those one image at a time;
    names the first differing example."""
    one = classify_images(model, pipeline, examples, labels, batch_size=1, device=device, autocast=autocast)
    many = classify_images(model, pipeline, examples, labels, batch_size=batch_size, device=device, autocast=autocast)
    diff = [e.id for e, a, b in zip(examples, one, many) if a != b]
    passed = not diff
    return {
        "passed": passed,
        "message": (
            f"{len(examples)} images: predictions at eval.batch_size {batch_size} equal those at batch size 1"
            if passed
            else f"predictions differ at eval.batch_size {batch_size} from batch size "
            f"1 on {len(diff)} of {len(examples)} images, first {diff[0]}"
        ),
        "numbers": {"n": len(examples), "batch_size": batch_size, "differ": len(diff)},
    }
