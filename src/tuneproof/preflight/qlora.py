"""Preflight checks of QLoRA (``method.kind: qlora``, tests/training/test_qlora.py), written as pure functions
over measured values so that each rule is tested on any machine.

1. :func:`check_quant_storage` -- when the 4-bit base is sharded (FSDP, world size > 1), the
   packed 4-bit values must be stored in a float dtype equal to the compute dtype
   (``method.bnb_4bit_quant_storage``). FSDP only shards floating-point tensors and can only
   flatten the tensors of one unit when they share one dtype; bitsandbytes reads the packed values
   byte by byte whatever the storage dtype, so the storage can be bf16/fp16/fp32. Source:
   bitsandbytes documentation, "FSDP-QLoRA" ("FSDP only supports sharding float data types ...
   It is very important the quant_storage data type matches the data types used throughout the
   model"), and PEFT's "Use PEFT QLoRA and FSDP" guide (``bnb_4bit_quant_storage`` = the model's
   dtype). The rule is written for FSDP's flat parameters; tuneproof's FSDP2 shards each parameter
   on its own, and on 2 gloo CPU processes a tiny QLoRA run with ``uint8`` storage also trained (the
   same losses as DDP) when the rule was disabled by hand. It is kept until measured with nccl on GPUs.
2. :func:`check_step_values` -- after one real training step on a real micro-batch, the loss and
   the gradient norm over the trainable (LoRA) tensors are finite and non-zero. A known silent
   failure of 4-bit fine-tuning elsewhere logs ``loss 0.0`` with ``grad_norm nan`` from the first
   steps on and trains nothing (QwenLM/Qwen3 issue 912, QLoRA with bitsandbytes: "grad_norm=Nan;
   loss=0"; hiyouga/LlamaFactory issue 8088); a loss of exactly 0 on real answers means nothing is
   supervised or the logits overflowed, a NaN/inf norm that the update would be NaN.
   :func:`measure_step` takes the measurements (forward, loss, backward) without changing a weight.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

import torch

from tuneproof.context import StudyContext
from tuneproof.preflight.report import check_result
from tuneproof.preflight.update_check import batch_loss

STORAGE_KEY = "method.bnb_4bit_quant_storage"
_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "half": "float16", "float": "float32"}
FLOAT_DTYPES = ("bfloat16", "float16", "float32")


def _dtype_name(name: str) -> str:
    """``bf16`` / ``torch.bfloat16`` / ``bfloat16`` -> ``bfloat16`` (torch's names)."""
    n = str(name).removeprefix("torch.")
    return _ALIASES.get(n, n)


def check_quant_storage(quant_storage: str, compute_dtype: str, *, sharded: bool) -> dict[str, Any]:
    """Is the 4-bit storage dtype shardable? (rule 1 of the module doc)

    Args:
        quant_storage: ``method.bnb_4bit_quant_storage`` (``uint8``, ``int8``, ``bfloat16``, ``float16``,
            ``float32``; ``bf16``/``fp16``/``fp32`` accepted).
        compute_dtype: the resolved compute dtype (``bf16``, ``bfloat16``, ``fp32`` ...).
        sharded: the base is sharded (``distributed.strategy: fsdp`` with world size > 1).

    Returns:
        ``{"name": "qlora storage", "passed", "message", "numbers": {"quant_storage", "compute_dtype", "sharded"}}``;
        not sharded: passes whatever the storage (nothing is flattened across ranks). The failure
        message names ``method.bnb_4bit_quant_storage`` and the value to set.
    """
    storage, compute = _dtype_name(quant_storage), _dtype_name(compute_dtype)
    numbers = {"quant_storage": storage, "compute_dtype": compute, "sharded": bool(sharded)}
    if not sharded:
        return {
            "name": "qlora storage",
            "passed": True,
            "numbers": numbers,
            "message": f"not sharded: 4-bit values stored as {storage} (FSDP would need {compute})",
        }
    if storage not in FLOAT_DTYPES:
        return {
            "name": "qlora storage",
            "passed": False,
            "numbers": numbers,
            "message": f"{STORAGE_KEY} is {storage}: FSDP shards only float tensors, "
            "so the 4-bit base cannot be sharded; "
            f"set {STORAGE_KEY}: {compute} (the compute dtype)",
        }
    if storage != compute:
        return {
            "name": "qlora storage",
            "passed": False,
            "numbers": numbers,
            "message": f"{STORAGE_KEY} is {storage} but the compute dtype is "
            f"{compute}: FSDP flattens one dtype per unit, "
            f"the 4-bit layers would not shard with the rest; set {STORAGE_KEY}: {compute}",
        }
    return {
        "name": "qlora storage",
        "passed": True,
        "numbers": numbers,
        "message": f"sharded: 4-bit values stored as {storage}, the compute dtype",
    }


def check_step_values(loss: float, grad_norm: float) -> dict[str, Any]:
    """Are the loss and the LoRA gradient norm of one real step finite and non-zero? (rule 2)

    Args:
        loss: mean loss of the step (nats per supervised token for a causal LM).
        grad_norm: L2 norm over every trainable tensor's gradient (the LoRA matrices).

    Returns:
        ``{"name": "qlora step", "passed", "message", "numbers": {"loss", "grad_norm"}}``; the failure
        message names each measured value that is wrong (``loss 0.0``, ``gradient norm nan``).
    """
    loss, grad_norm = float(loss), float(grad_norm)
    numbers = {"loss": loss, "grad_norm": grad_norm}
    wrong = []
    for what, v in (("loss", loss), ("LoRA gradient norm", grad_norm)):
        if not math.isfinite(v):
            wrong.append(f"{what} {v} is not finite")
        elif v == 0.0:
            wrong.append(f"{what} {v} is zero")
    if wrong:
        return {
            "name": "qlora step",
            "passed": False,
            "numbers": numbers,
            "message": f"after one training step on the 4-bit base: {'; '.join(wrong)} (the silent QLoRA failure: "
            "loss 0.0 / grad norm NaN trains nothing); check training.precision "
            "(the compute dtype: bf16 rather than fp16) "
            "and that the training examples have supervised answer tokens",
        }
    return {
        "name": "qlora step",
        "passed": True,
        "numbers": numbers,
        "message": f"one training step on the 4-bit base: loss {loss:.6g}, LoRA "
        f"gradient norm {grad_norm:.6g} (finite, non-zero)",
    }


def measure_step(model, batch: dict, autocast: Callable = None) -> dict[str, float]:
    """Loss and gradient norm of one training step (forward, per-token loss, backward) on ``batch``.

    The gradients are cleared afterwards and no optimizer step is taken: no weight changes.
    The norm is the L2 norm over the gradients of every trainable tensor (NaN when any is NaN;
    a trainable tensor the backward pass did not reach counts 0).

    Returns:
        ``{"loss", "grad_norm", "trainable_tensors", "tensors_with_grad"}``.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = None
    was_training = model.training
    model.train()
    try:
        with (autocast or contextlib.nullcontext)():
            loss = batch_loss(model, batch)
        loss.backward()
        grads = [p.grad.detach().float() for p in params if p.grad is not None]
        norm = (
            torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
            if grads
            else torch.tensor(0.0)
        )
        return {
            "loss": float(loss.detach().float()),
            "grad_norm": float(norm),
            "trainable_tensors": len(params),
            "tensors_with_grad": len(grads),
        }
    finally:
        for p in params:
            p.grad = None
        model.train(was_training)


# --------------------------------------------------------------------------- the preflight's checks on a study
def check_qlora_storage(ctx: StudyContext) -> dict[str, Any]:
    """``qlora storage``: :func:`check_quant_storage` on the study's quantization, unsharded (this single
    process shards nothing); with ``distributed.strategy: fsdp`` a storage that ``tuneproof train
    --nproc-per-node N`` would refuse under FSDP is a warning, said now."""
    q = ctx.quantization
    fsdp = ctx.study.distributed.strategy == "fsdp"
    c = check_quant_storage(q["bnb_4bit_quant_storage"], q["bnb_4bit_compute_dtype"], sharded=False)
    extra = {}
    if fsdp:
        under = check_quant_storage(q["bnb_4bit_quant_storage"], q["bnb_4bit_compute_dtype"], sharded=True)
        if not under["passed"]:
            extra["warning"] = f"distributed.strategy fsdp with N > 1 processes will be refused: {under['message']}"
    return check_result(c["name"], c["passed"], c["message"], c["numbers"], {"quantization": q}, **extra)


def check_qlora_step(model, batch: dict, autocast: Callable) -> dict[str, Any]:
    """``qlora step``: loss and LoRA gradient norm of one real step on ``batch`` (:func:`measure_step`)
    finite and non-zero (:func:`check_step_values`)."""
    m = measure_step(model, batch, autocast)
    c = check_step_values(m["loss"], m["grad_norm"])
    numbers = {**c["numbers"], "tensors_with_grad": m["tensors_with_grad"]}
    return check_result(c["name"], c["passed"], c["message"], numbers, m)
