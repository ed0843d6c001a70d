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

from tuneproof.data.preprocess import collate, collate_packed, packed_padding
from tuneproof.errors import CheckFailed
from tuneproof.models.device import BF16_BASE_KEY
from tuneproof.models.method import cast_frozen_to_bf16
from tuneproof.study import turn_off
from tuneproof.training.data_order import epoch_micro_batches
from tuneproof.training.loss import check_chunked_loss, supervised_count
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
            hint=turn_off(cfg, "packing"),
        )
    sample = packing_sample(train_set, cfg.micro_batch_size)
    if len(sample) < 2:
        raise CheckFailed("training.packing needs at least 2 training examples", hint=turn_off(cfg, "packing"))
    check = check_packing(model, sample, pad_id, packing_capacity(cfg))
    if not check["passed"]:
        raise CheckFailed(f"training.packing: {check['message']}", hint=turn_off(cfg, "packing"))
    return {k: check[k] for k in ("max_abs_diff", "control_max_abs_diff", "tokens", "rows", "examples", "atol")}


def check_chunked_on_batch(model, examples: list, pad_id: int, device, capacity: int | None = None) -> dict[str, Any]:
    """:func:`tuneproof.training.loss.check_chunked_loss` on one real micro-batch, dropout off;
    ``capacity``: the micro-batch packed into rows of that many tokens (``training.packing``)."""
    if capacity is not None and (examples[0].class_index is not None or not examples[0].labels):
        return {
            "passed": False,
            "message": "the chunked loss applies to causal LMs (token labels), not to a classification head",
        }
    batch = {
        k: v.to(device)
        for k, v in (
            collate_packed(examples, pad_id, capacity) if capacity is not None else collate(examples, pad_id)
        ).items()
    }
    if batch["labels"].dim() != 2:
        return {
            "passed": False,
            "message": "the chunked loss applies to causal LMs (token labels), not to a classification head",
        }
    was_training = model.training
    model.eval()  # the same function twice: dropout masks must not differ
    try:
        return check_chunked_loss(model, batch)
    finally:
        model.train(was_training)


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


# -------------------------------------------------- length grouping (tests/training/test_speedups_auto.py)
#: The length-grouping check: the summed loss of one real micro-batch padded together (the sampler's
#: first one, mixed lengths) within LENGTH_GROUPING_LOSS_RTOL (relative) of the sum of its examples'
#: losses each alone (no padding), and every trained gradient within LENGTH_GROUPING_GRAD_RTOL
#: (``max|g_batch - g_alone| / max|g_alone|``), in fp32 without autocast, dropout off. Grouping
#: only changes which examples share a micro-batch, so it computes the same per-token losses when an
#: example's loss does not depend on its batch mates or its padding; that is what this proves.
#: Why these numbers: in fp32 the two differ only by the summation order of matrix products of other
#: shapes, measured (2026-12-02) 2.7e-8 (loss) and 1.9e-7 (gradients) on a tiny random Llama (2 layers,
#: LoRA r4, 4 examples of 4-12 tokens) and 4.5e-8 / 4.6e-7 on SmolLM2-135M + LoRA r16 (the first 4 SNIPS
#: examples of the quickstart's first micro-batch, max_length 144); padding that leaks into attention
#: (left padding left unmasked, tests/training/test_speedups_auto.py) moves the loss by 2.4e-3 and the
#: gradients by 0.68 on the tiny Llama.
LENGTH_GROUPING_LOSS_RTOL = 1e-4
#: examples of the first micro-batch the check compares (together, then each alone: 1 + this many passes)
LENGTH_GROUPING_EXAMPLES = 4
LENGTH_GROUPING_GRAD_RTOL = 1e-3


def check_length_grouping(model, examples: list, pad_id: int, device, loss_fn) -> dict[str, Any]:
    """Prove that an example's loss and gradients do not depend on the micro-batch it shares
    (the condition under which ``training.length_grouping`` changes only the order of the data).

    Args:
        examples: one real micro-batch (at least 2 examples of different lengths for a real test).
        loss_fn: ``model, batch -> (summed loss, V)`` in fp32 (no autocast).

    Returns:
        ``{"passed", "loss_batch", "loss_alone" (summed, nats), "loss_rel_diff", "grad_max_rel_diff",
        "tensors", "examples", "padding" (share of padded positions in the batch), "rtol": {"loss",
        "grad"}, "message"}``. Gradients are cleared before and after.
    """
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    was_training = model.training
    model.eval()

    def grads_of(batches: list[list]) -> tuple[float, dict[str, torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        total = 0.0
        for group in batches:
            batch = {k: v.to(device) for k, v in collate(group, pad_id).items()}
            loss, _ = loss_fn(model, batch)
            loss.backward()
            total += float(loss.detach())
        return total, {n: p.grad.detach().float().clone() for n, p in params if p.grad is not None}

    try:
        l_batch, g_batch = grads_of([examples])
        l_alone, g_alone = grads_of([[e] for e in examples])
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was_training)
    lengths = [len(e.input_ids) for e in examples]
    padding = 1 - sum(lengths) / (len(lengths) * max(lengths)) if lengths else 0.0
    scale = max((float(g.abs().max()) for g in g_alone.values()), default=0.0) or 1.0
    grad_diff = max(
        (float((g_batch[n] - g).abs().max()) / scale for n, g in g_alone.items() if n in g_batch), default=0.0
    )
    loss_diff = abs(l_batch - l_alone) / max(abs(l_alone), 1e-12)
    finite = math.isfinite(l_batch) and math.isfinite(l_alone)
    passed = finite and loss_diff <= LENGTH_GROUPING_LOSS_RTOL and grad_diff <= LENGTH_GROUPING_GRAD_RTOL
    numbers = (
        f"{len(examples)} examples of {min(lengths)}-{max(lengths)} tokens ({padding:.0%} padding) together vs alone: "
        f"loss rel. diff {loss_diff:.1e} (<= {LENGTH_GROUPING_LOSS_RTOL:g}), gradients max rel. diff {grad_diff:.1e} "
        f"(<= {LENGTH_GROUPING_GRAD_RTOL:g}) over {len(g_alone)} tensors"
    )
    return {
        "passed": passed,
        "loss_batch": l_batch,
        "loss_alone": l_alone,
        "loss_rel_diff": loss_diff,
        "grad_max_rel_diff": grad_diff,
        "tensors": len(g_alone),
        "examples": len(examples),
        "padding": round(padding, 6),
        "rtol": {"loss": LENGTH_GROUPING_LOSS_RTOL, "grad": LENGTH_GROUPING_GRAD_RTOL},
        "message": (
            f"an example's loss does not depend on its batch mates: {numbers}"
            if passed
            else f"an example's loss depends on its batch mates or padding: {numbers}; "
            "leave training.length_grouping off"
        ),
    }


# ----------------------------------------------------------------- training.speedups: auto
def static_rules(
    *,
    device_type: str,
    bf16_base: tuple[bool, str],
    attention: str | None,
    method_kind: str,
    token_labels: bool,
    world_size: int = 1,
) -> dict[str, tuple[bool, str]]:
    """Which speed-ups ``training.speedups: auto`` tries here, before any check runs: ``{name:
    (tried, why)}`` for packing, bf16 frozen weights and compile, decided by the device, the
    attention implementation, the method and the world size (:func:`resolve_auto` tries length
    grouping and the chunked loss wherever they apply).

    Rules (docs/speedups.md): packing only with a varlen attention kernel (``flash_attention_*``) on a
    GPU: elsewhere a packed row is one dense row under a block mask, no fewer FLOPs than padding;
    bf16 frozen weights where :func:`tuneproof.models.device.bf16_base_rule` allows them (native
    bf16, bf16 compute), LoRA only, and not for a causal LM (not yet checked together with the chunked
    loss or packing, ``tuneproof.study``'s rule; auto keeps those); compile only on a GPU (on this
    project's CPU it did not pay back its compile time within a quickstart's budget,
    docs/benchmarks-compile.md); none of the three under DDP/FSDP (not yet checked there)."""
    rules: dict[str, tuple[bool, str]] = {}
    dist = f"not yet checked under DDP/FSDP (world size {world_size})" if world_size > 1 else None
    flash = bool(attention) and str(attention).startswith("flash_attention")
    if not token_labels:
        rules["packing"] = (False, "applies to causal LMs (token labels), not to a classification head")
    elif dist:
        rules["packing"] = (False, dist)
    elif device_type == "cpu" or not flash:
        rules["packing"] = (
            False,
            f"pays only with varlen (flash) attention on a GPU; here {attention or 'the default'} attention on "
            f"{device_type} computes a packed row as one masked dense row",
        )
    else:
        rules["packing"] = (True, f"{attention} on {device_type}: packed rows skip padding")
    allowed, why = bf16_base
    if method_kind != "lora":
        rules["bf16_base_weights"] = (
            False,
            f"applies to LoRA (fp32 frozen base weights), not to method {method_kind}",
        )
    elif token_labels:
        rules["bf16_base_weights"] = (
            False,
            "not yet checked together with the chunked loss or packing (each is proven against fp32 frozen "
            "weights alone): auto keeps those for a causal LM; list bf16_base_weights in training.speedups instead",
        )
    elif dist:
        rules["bf16_base_weights"] = (False, dist)
    else:
        rules["bf16_base_weights"] = (allowed, why.split("; set ")[0])
    if dist:
        rules["compile"] = (False, dist)
    elif device_type == "cpu":
        rules["compile"] = (
            False,
            "not tried on a CPU: its compile time was not paid back within a quickstart's budget "
            "(docs/benchmarks-compile.md); set training.speedups: [compile, ...] to measure it",
        )
    else:
        rules["compile"] = (True, f"on {device_type}: tried; used when it pays within the planned steps")
    return rules


def resolve_auto(
    model,
    train_set: list,
    cfg,
    *,
    pad_id: int,
    device,
    loss_fn,
    fp32_loss_fn,
    rules: dict[str, tuple[bool, str]] | None,
    world_size: int = 1,
    rank: int = 0,
    try_bf16: bool = True,
    try_compile: bool = True,
) -> tuple[Any, dict[str, Any]]:
    """Resolve ``training.speedups: auto``: try each speed-up that applies here with its own check on
    the study's real micro-batches and turn on those that pass; a failed or inapplicable one stays
    off with a one-line reason (docs/speedups.md).

    Order: packing (the layout the others are checked on), length grouping (never turned on here: it
    changes which examples share an optimizer step, so the run's updates are not the same ones; its
    reason says what padding it would save; listed explicitly it runs :func:`check_length_grouping`), the chunked
    loss (:func:`tuneproof.training.loss.check_chunked_loss`, causal LMs, one process), bf16 frozen
    weights (:func:`check_bf16_base`; casts the model when it passes), compile (left to the caller:
    ``try_compile`` only marks it for :func:`tuneproof.training.compiled.prove_compile`).

    Args:
        cfg: the study's ``training`` section with ``speedups: auto``.
        loss_fn: ``model, batch -> (summed loss, V)``, the loop's loss under its autocast.
        fp32_loss_fn: the same without autocast (the length-grouping check compares in fp32).
        rules: :func:`static_rules` for this device and study; None (no device information, unit
            tests): packing, bf16 frozen weights and compile stay off.
        try_bf16: False where the caller runs the bf16 check itself (the preflight, before which its
            precision checks need fp32 weights): the rule alone decides it here.

    Returns:
        ``(resolved cfg, record)``: a copy of ``cfg`` with each boolean key set as decided and
        ``speedups`` the list of those used (a valid study section), and ``{"used": [names],
        "decisions": {name: {"used", "reason"}}}``.
    """
    rules = rules or {
        k: (False, "no device information to decide it") for k in ("packing", "bf16_base_weights", "compile")
    }
    decisions: dict[str, dict[str, Any]] = {}
    on: dict[str, bool] = dict.fromkeys(
        ("packing", "length_grouping", "chunked_loss", "bf16_base_weights", "compile"), False
    )
    tokens = bool(train_set) and hasattr(train_set[0], "input_ids")
    token_labels = tokens and train_set[0].class_index is None and bool(train_set[0].labels)

    def decide(name: str, used: bool, reason: str) -> None:
        on[name] = used
        decisions[name] = {"used": used, "reason": reason}

    # packing
    tried, why = rules.get("packing", (False, "no rule"))
    if tried:
        try:
            proof = prove_packing(model, train_set, cfg, pad_id, device)
            decide("packing", True, f"check passed: packed per-token losses within {proof['atol']:g} of alone")
        except CheckFailed as err:
            decide("packing", False, f"check failed: {str(err).splitlines()[0]}")
    else:
        decide("packing", False, why)
    # length grouping
    if not tokens:
        decide("length_grouping", False, "applies to token sequences (images have no padding)")
    elif cfg.micro_batch_size < 2 or len(train_set) <= cfg.micro_batch_size:
        decide(
            "length_grouping",
            False,
            "one micro-batch of one example at a time, or one micro-batch an epoch: nothing to group",
        )
    else:
        pad = padding_report(
            train_set, cfg.model_copy(update={"length_grouping": True, "packing": on["packing"]}), world_size, rank
        )
        plain = padding_report(
            train_set, cfg.model_copy(update={"length_grouping": False, "packing": on["packing"]}), world_size, rank
        )
        if pad["after"] >= plain["after"]:
            decide(
                "length_grouping",
                False,
                f"does not lower the padding here ({plain['after']:.1%} -> {pad['after']:.1%})",
            )
        else:
            decide(
                "length_grouping",
                False,
                f"would lower the padding {plain['after']:.1%} -> {pad['after']:.1%} but changes which examples share "
                "an optimizer step (another trajectory, as another seed; docs/speedups.md): auto uses only what leaves "
                "each step unchanged; list length_grouping in training.speedups to accept that",
            )
    # chunked loss
    if not token_labels:
        decide("chunked_loss", False, "applies to causal LMs (token labels), not to a classification head")
    elif world_size > 1:
        decide("chunked_loss", False, f"not yet checked under DDP/FSDP (world size {world_size})")
    else:
        check = check_chunked_on_batch(
            model, train_set[: cfg.micro_batch_size], pad_id, device, packing_capacity(cfg) if on["packing"] else None
        )
        if check["passed"]:
            decide(
                "chunked_loss",
                True,
                f"check passed (loss rel. diff {check['loss_rel_diff']:.1e}, "
                f"gradients {check['grad_max_rel_diff']:.1e})",
            )
            # the loop uses this proof instead of running the same check on the same micro-batch again
            decisions["chunked_loss"]["proof"] = {
                k: check[k] for k in ("loss_rel_diff", "grad_max_rel_diff", "tensors")
            }
        else:
            decide("chunked_loss", False, f"check failed: {check['message']}")
    # bf16 frozen weights (last: it casts the model)
    tried, why = rules.get("bf16_base_weights", (False, "no rule"))
    if tried and try_bf16:
        try:
            prove_bf16_base(model, train_set, cfg, pad_id, device, loss_fn)
            decide(
                "bf16_base_weights",
                True,
                "check passed: loss and gradients within the stated tolerances of fp32 frozen weights",
            )
        except CheckFailed as err:
            decide("bf16_base_weights", False, f"check failed: {str(err).splitlines()[0]}")
    else:
        decide("bf16_base_weights", tried and not try_bf16, why)
    tried, why = rules.get("compile", (False, "no rule"))
    decide("compile", bool(tried and try_compile), why)
    used = [k for k, v in on.items() if v]
    return cfg.model_copy(update={**on, "speedups": used}), {"used": used, "decisions": decisions}
