"""Speed-ups of the training loop that change how micro-batches are laid out, never what is
computed (docs/PROTOCOL.md step 5): length grouping (:func:`tuneproof.training.data_order.epoch_micro_batches`)
and padding-free packing (:func:`tuneproof.data.preprocess.collate_packed`). Packing is used only
after :func:`tuneproof.training.packing.check_packing` passed on real training examples; the run
summary records it under ``speedups`` and the padding share under ``padding``.

Frozen base weights held in bf16 (``training.bf16_base_weights``, :func:`prove_bf16_base`) change
how the weights are stored: used only after :func:`check_bf16_base` found the loss and the trained
tensors' gradients equal to fp32 frozen weights within stated tolerances; the summary records the
check and the measured peak memory with and without.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from tuneproof.data.preprocess import collate, packed_padding
from tuneproof.errors import CheckFailed
from tuneproof.models.device import BF16_BASE_KEY
from tuneproof.models.method import cast_frozen_to_bf16
from tuneproof.training.data_order import epoch_micro_batches
from tuneproof.training.loss import supervised_count
from tuneproof.training.memory import measure_step_peak
from tuneproof.training.packing import check_packing, packing_sample


def packing_capacity(cfg) -> int:
    """Row capacity in tokens of a packed micro-batch (``training.packing``): ``training.packing_length``,
    or ``micro_batch_size x max_length`` when it is not set, so every micro-batch becomes one row
    without padding. (Rows of only ``max_length`` hold one or two examples of a set whose lengths
    are above half of it: the rows are then padded to the longest row and packing *adds* padding:
    SNIPS at max_length 144 went from 20.6 % to 26.3 % padding that way.)"""
    length = getattr(cfg, "packing_length", None)
    return int(length) if length else int(cfg.micro_batch_size) * int(cfg.max_length)


def padding_report(train_set: list, cfg, world_size: int = 1, rank: int = 0, epoch: int = 0) -> dict[str, Any]:
    """Padding share of one epoch of this process, before (sampler order, each micro-batch padded
    to its longest example) and after the configured layout (length grouping and/or packing).

    Returns:
        ``{"before", "after" (fractions of positions that are padding, 6 decimals), "layout"
        ("padded" | "length_grouping" | "packing" | "length_grouping+packing"), "epoch", "positions_before",
        "positions_after", "tokens"}``.
    """
    n, mb = len(train_set), cfg.micro_batch_size
    lengths = [len(e.input_ids) for e in train_set]
    grouping, packing = bool(getattr(cfg, "length_grouping", False)), bool(getattr(cfg, "packing", False))
    plain = epoch_micro_batches(n, mb, cfg.seed, epoch, world_size=world_size, rank=rank)
    used = (
        epoch_micro_batches(n, mb, cfg.seed, epoch, world_size=world_size, rank=rank, lengths=lengths)
        if grouping
        else plain
    )
    tokens = sum(lengths[i] for b in plain for i in b)

    def positions(batches, packed: bool) -> int:
        if packed:
            return sum(packed_padding([lengths[i] for i in b], packing_capacity(cfg))[1] for b in batches)
        return sum(len(b) * max(lengths[i] for i in b) for b in batches)

    before, after = positions(plain, False), positions(used, packing)
    layout = "+".join(k for k, on in (("length_grouping", grouping), ("packing", packing)) if on) or "padded"
    return {
        "before": round(1 - tokens / before, 6),
        "after": round(1 - tokens / after, 6),
        "layout": layout,
        "epoch": epoch,
        "positions_before": before,
        "positions_after": after,
        "tokens": tokens,
    }


def prove_packing(model, train_set: list, cfg, pad_id: int, device) -> dict[str, Any]:
    """Run the packing check on real training examples before packing is used.

    Returns:
        what the summary's ``speedups.packing`` records: ``max_abs_diff``, ``control_max_abs_diff``,
        ``tokens``, ``rows``, ``examples``, ``atol``.

    Raises:
        CheckFailed: classification examples, or the packed rows differ from the examples alone.
    """
    if not train_set or train_set[0].class_index is not None or not train_set[0].labels:
        raise CheckFailed(
            "training.packing applies to causal LMs (token labels), not to sequence classification",
            hint="set training.packing: false",
        )
    sample = packing_sample(train_set, cfg.micro_batch_size)
    if len(sample) < 2:
        raise CheckFailed("training.packing needs at least 2 training examples", hint="set training.packing: false")
    check = check_packing(model, sample, pad_id, packing_capacity(cfg))
    if not check["passed"]:
        raise CheckFailed(f"training.packing: {check['message']}", hint="set training.packing: false")
    return {k: check[k] for k in ("max_abs_diff", "control_max_abs_diff", "tokens", "rows", "examples", "atol")}


# ----------------------------------------------------------------- bf16 base weights (tests/training/test_bf16_base.py)
#: The bf16-base check: on one real micro-batch, under the same autocast, the per-token loss with the
#: frozen weights held in bf16 within BF16_BASE_LOSS_RTOL (relative) of the loss with them in fp32,
#: and the trained tensors' gradients (all of them as one vector) within BF16_BASE_GRAD_REL_L2
#: relative L2 error (``||g_bf16 - g_fp32|| / ||g_fp32||``) and at least BF16_BASE_GRAD_COSINE cosine.
#: Why these numbers: under bf16 autocast the reference already multiplies by bf16 copies of the
#: linear weights, so holding those in bf16 changes nothing; what changes is that the embeddings,
#: norms and, through them, the residual stream are rounded to bf16's 8 significant bits (at most
#: 2**-9 relative per value, about 2**-8 = 0.4% per operation), and these roundings add up over the
#: layers, in the gradients more than in the loss. Measured (2026-12-01, CPU): a tiny random Llama
#: (2 layers, LoRA r4): loss 3.5e-5, gradients rel. L2 0.008, cosine 0.99997; SmolLM2-135M (30 layers,
#: LoRA r16 on q/k/v/o, SNIPS, 4 x 512 tokens, docs/benchmarks-train-step.md): loss 4.0e-4, rel. L2
#: 0.048, cosine 0.9989. The limits leave 25x (loss), 2x (rel. L2) and 4.6x (1 - cosine) over the
#: deeper model. What they catch: a wrong cast or a model that needs fp32 norms/embeddings (errors
#: of the order of the gradient itself); 10% noise on the frozen linear weights fails them (rel. L2
#: 0.20, cosine 0.983 on the tiny Llama). What they do not resolve on a shallow model: 3% noise or
#: rounding the linear weights to fp8 e4m3 (rel. L2 0.06 and 0.08 there) pass.
BF16_BASE_LOSS_RTOL = 1e-2
BF16_BASE_GRAD_REL_L2 = 0.1
BF16_BASE_GRAD_COSINE = 0.995


def _grad_vector(params: list) -> torch.Tensor:
    return torch.cat(
        [(p.grad if p.grad is not None else torch.zeros_like(p)).detach().float().reshape(-1).cpu() for _, p in params]
    )


def check_bf16_base(model, batch: dict, loss_fn, *, device: Any = "cpu", cast=None) -> dict[str, Any]:
    """Prove that holding the frozen weights in bf16 leaves the loss and the trained tensors'
    gradients as they are (within the stated tolerances), on one micro-batch, and measure the peak
    memory of one forward + backward with each.

    Steps, dropout off (``model.eval()``, the same function each time): one forward + backward with
    the frozen weights as they are (fp32; a warm-up, not measured), one more measured with
    :func:`tuneproof.training.memory.measure_step_peak` (the reference: loss and gradients), then
    ``cast(model)`` (default :func:`tuneproof.models.method.cast_frozen_to_bf16`) and one measured
    forward + backward with bf16 frozen weights. The optimizer step is left out of both measured
    steps (it would move the weights; its states belong to the fp32 trained tensors, the same in both).
    Gradients are cleared before and after.

    Args:
        model: the model as training gets it (PEFT-wrapped, frozen weights in fp32), on ``device``.
        batch: one real micro-batch (``collate``), on ``device``.
        loss_fn: ``model, batch -> (summed loss, V)``, the loop's own loss under its autocast
            (:func:`tuneproof.training.loop._micro_loss`); divided here by the supervised count.
        cast: the cast to check (tests pass a broken one).

    Returns:
        ``{"passed", "loss_fp32", "loss_bf16" (nats per supervised token), "loss_rel_diff",
        "grad_rel_l2", "grad_cosine", "tensors" (trained tensors compared), "cast" (what
        ``cast`` returned), "memory": {"fp32_frozen_peak_bytes", "bf16_frozen_peak_bytes",
        "fp32_frozen_step_peak_bytes", "bf16_frozen_step_peak_bytes", "peak_drop_bytes", "method",
        "approximate"}, "tolerance": {"loss_rtol", "grad_rel_l2", "grad_cosine"}, "message"}``.
        When it fails, the cast tensors are put back in their dtype (fp32; their values keep the
        bf16 rounding) and the caller must not use the bf16 base.
    """
    cast = cast or cast_frozen_to_bf16
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    count = max(supervised_count(batch), 1)
    before = {id(p): p.dtype for p in model.parameters() if not p.requires_grad}
    was_training = model.training
    model.eval()
    out: dict[str, float] = {}

    def fwd_bwd(tag: str) -> None:
        model.zero_grad(set_to_none=True)
        loss, _ = loss_fn(model, batch)
        (loss / count).backward()
        out[tag] = float(loss.detach()) / count

    try:
        fwd_bwd("warm-up")
        m32 = measure_step_peak(lambda: fwd_bwd("fp32"), device)
        g32 = _grad_vector(params)
        model.zero_grad(set_to_none=True)
        did = cast(model)
        m16 = measure_step_peak(lambda: fwd_bwd("bf16"), device)
        g16 = _grad_vector(params)
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was_training)
    l32, l16 = out["fp32"], out["bf16"]
    finite = math.isfinite(l16) and bool(torch.isfinite(g16).all())
    rel = abs(l16 - l32) / max(abs(l32), 1e-12)
    ref_norm = float(g32.norm())
    rel_l2 = float((g16 - g32).norm()) / ref_norm if ref_norm > 0 else float("inf")
    cos = float(torch.nn.functional.cosine_similarity(g32, g16, dim=0)) if finite and ref_norm > 0 else float("nan")
    passed = finite and rel <= BF16_BASE_LOSS_RTOL and rel_l2 <= BF16_BASE_GRAD_REL_L2 and cos >= BF16_BASE_GRAD_COSINE
    p32, p16 = m32.get("peak_bytes"), m16.get("peak_bytes")
    memory = {
        "fp32_frozen_peak_bytes": p32,
        "bf16_frozen_peak_bytes": p16,
        "fp32_frozen_step_peak_bytes": m32.get("step_peak_bytes"),
        "bf16_frozen_step_peak_bytes": m16.get("step_peak_bytes"),
        "peak_drop_bytes": (p32 - p16) if (p32 is not None and p16 is not None) else None,
        "method": m16.get("method"),
        "approximate": bool(m32.get("approximate") or m16.get("approximate")),
        "step": "one forward + backward of the micro-batch (no optimizer step), the weights included",
    }
    numbers = (
        f"loss {l16:.6g} vs {l32:.6g} (rel. diff {rel:.1e}, limit {BF16_BASE_LOSS_RTOL:g}), gradients of {len(params)} "
        f"trained tensors: rel. L2 error {rel_l2:.1e} (limit {BF16_BASE_GRAD_REL_L2:g}), cosine {cos:.6f} (min "
        f"{BF16_BASE_GRAD_COSINE:g})"
    )
    if passed:
        drop = memory["peak_drop_bytes"]
        message = (
            f"bf16 frozen weights match fp32 ones: {numbers}; {did.get('cast_tensors')} frozen tensors in bf16 "
            f"({did.get('bytes_saved', 0) / 2**20:.1f} MiB less)"
            + (f", peak of a forward + backward {drop / 2**20:.1f} MiB lower" if drop is not None else "")
        )
    else:
        for (
            p
        ) in model.parameters():  # put the frozen tensors back in their dtype: the caller does not use the bf16 base
            if id(p) in before and p.dtype != before[id(p)]:
                p.data = p.data.to(before[id(p)])
        message = (
            f"bf16 frozen weights change what is computed: {numbers}"
            + ("" if finite else " (non-finite)")
            + f"; leave {BF16_BASE_KEY} off"
        )
    return {
        "passed": passed,
        "loss_fp32": l32,
        "loss_bf16": l16,
        "loss_rel_diff": rel,
        "grad_rel_l2": rel_l2,
        "grad_cosine": cos,
        "tensors": len(params),
        "cast": did,
        "memory": memory,
        "tolerance": {
            "loss_rtol": BF16_BASE_LOSS_RTOL,
            "grad_rel_l2": BF16_BASE_GRAD_REL_L2,
            "grad_cosine": BF16_BASE_GRAD_COSINE,
        },
        "message": message,
    }


def prove_bf16_base(model, train_set: list, cfg, pad_id: int, device, loss_fn) -> dict[str, Any]:
    """Check (:func:`check_bf16_base`) and apply ``training.bf16_base_weights`` on the first real
    micro-batch of ``train_set`` before training uses it; the frozen weights are bf16 afterwards.
    ``loss_fn``: ``model, batch -> (summed loss, V)``, the loop's own micro-batch loss under its autocast.

    Returns:
        what the summary's ``speedups.bf16_base_weights`` records: the check's numbers, tolerances,
        the cast and the measured peaks with and without.

    Raises:
        CheckFailed: the check failed (the run does not train with a bf16 base; its message names
            the numbers and the key), or the model has no trained tensor / no frozen fp32 tensor.
    """
    if not any(p.requires_grad for p in model.parameters()):
        raise CheckFailed(f"{BF16_BASE_KEY}: the model has no trained tensor", hint=f"set {BF16_BASE_KEY}: false")
    batch = {k: v.to(device) for k, v in collate(train_set[: cfg.micro_batch_size], pad_id).items()}
    check = check_bf16_base(model, batch, loss_fn, device=device)
    if not check["passed"]:
        raise CheckFailed(f"{BF16_BASE_KEY}: {check['message']}", hint=f"set {BF16_BASE_KEY}: false")
    if not check["cast"].get("cast_tensors"):
        raise CheckFailed(f"{BF16_BASE_KEY}: no frozen fp32 tensor to hold in bf16", hint=f"set {BF16_BASE_KEY}: false")
    return {
        k: check[k]
        for k in (
            "loss_fp32",
            "loss_bf16",
            "loss_rel_diff",
            "grad_rel_l2",
            "grad_cosine",
            "tensors",
            "cast",
            "memory",
            "tolerance",
        )
    }
