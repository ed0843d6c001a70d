"""Preflight check ``training data``: the train split through the trainer's exact preprocessing has
no hard fault (what ``train`` refuses), with its token lengths p50/p95/max after truncation
(``training.max_length``, :func:`check_text_training_data`); for images, one model-input shape and no
faulty image (:func:`check_image_training_data`). The ``training data`` row of
:data:`tuneproof.preflight.checks.CHECKS` names which one runs for each modality."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tuneproof.context import StudyContext
from tuneproof.preflight.report import check_result


def check_image_training_data(ctx: StudyContext, encoded: list) -> dict[str, Any]:
    """The train images after the exact preprocessing (``encoded``: ``ctx.pipeline.encode_all`` of
    them): no faulty image, one model-input shape ``[C, H, W]`` (a micro-batch stacks them)."""
    bad = [e for e in encoded if e.faults]
    shapes = sorted({tuple(e.pixel_values.shape) for e in encoded})
    numbers = {
        "examples": len(encoded),
        "faulty": len(bad),
        "tensor_shapes": [list(x) for x in shapes],
        "flipped": sum(1 for e in encoded if e.flipped),
    }
    passed = bool(encoded) and not bad and len(shapes) == 1
    message = (
        f"{len(encoded)} train images, model input {list(shapes[0]) if shapes else '-'}, {numbers['flipped']} mirrored"
        if passed
        else f"{len(bad)} faulty images, tensor shapes {shapes} (one shape needed: set data.image.resize)"
    )
    return check_result(
        "training data",
        passed,
        message,
        numbers,
        {"faults": [{"id": e.id, "faults": e.faults} for e in bad[:50]]} if bad else None,
    )


def check_text_training_data(ctx: StudyContext, encoded: list) -> dict[str, Any]:
    """The train split after the exact preprocessing (``encoded``: ``ctx.pipeline.encode_all`` of it):
    no hard fault, token lengths (after truncation)."""
    bad = [e for e in encoded if e.faults]
    lengths = [len(e.input_ids) for e in encoded]
    max_len = ctx.study.training.max_length
    numbers = {"examples": len(encoded), "faulty": len(bad), "max_length": max_len}
    if lengths:
        numbers.update(
            p50=int(math.ceil(np.percentile(lengths, 50))),
            p95=int(math.ceil(np.percentile(lengths, 95))),
            max=max(lengths),
            truncated=sum(1 for e in encoded if e.truncated),
            supervised_tokens=sum(e.n_supervised for e in encoded),
        )
    if not encoded:
        return check_result("training data", False, "the train split is empty", numbers)
    if bad:
        first = bad[0]
        return check_result(
            "training data",
            False,
            f"{len(bad)} of {len(encoded)} train examples have hard faults (train refuses them); "
            f"first {first.id}: {first.faults[0]}",
            numbers,
            {"faults": [{"id": e.id, "faults": e.faults} for e in bad[:50]]},
        )
    return check_result(
        "training data",
        True,
        f"{len(encoded)} train examples, token lengths p50 {numbers['p50']}, p95 {numbers['p95']}, "
        f"max {numbers['max']} (max_length {max_len}, {numbers['truncated']} truncated)",
        numbers,
    )
