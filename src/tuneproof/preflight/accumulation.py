"""Gradient accumulation builds the same update as the concatenated batch (docs/PROTOCOL.md step 5,
docs/CASES.md C1).

With ``k`` micro-batches per optimizer step, the loss of the update is the mean over every
supervised token of the whole window: each micro-batch contributes
``token_loss_sum(micro-batch) / N_window`` (``tuneproof.training.loss``). Dividing each
micro-batch by its own token count instead (the mean of means) weights a token of a short
micro-batch more than a token of a long one. :func:`check_accumulation` runs both the
accumulated window and the concatenated batch through the model and compares loss and
gradients; it also reports the mean-of-means value so the difference is visible.

A window never crosses an epoch boundary (docs/CASES.md C18): when the micro-batches of an epoch are not a
multiple of the accumulation, the last window of each epoch holds only what is left
(:func:`last_window_micro_batches`), and its loss is the per-token mean over what it holds.
:func:`check_windows` checks that short window against its concatenation too, not only the
first full one.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tuneproof.data.preprocess import IGNORE_INDEX, collate
from tuneproof.errors import TuneproofError
from tuneproof.preflight.report import check_result
from tuneproof.preflight.update_check import is_token_batch, loss_sum_and_count
from tuneproof.training.budget import micro_batches_per_epoch, optimizer_steps_per_epoch
from tuneproof.training.data_order import window_at
from tuneproof.training.loop import micro_batch_indices
from tuneproof.training.loss import NORMALISATION, window_losses

NORMALISATION_CLASSIFICATION = (
    "per-example mean over the accumulation window (sum of example losses / examples in the window)"
)

#: Value used to right-pad each key when micro-batches are concatenated.
_PAD = {"labels": IGNORE_INDEX, "attention_mask": 0}


def concat_micro_batches(micro_batches: list[dict]) -> dict:
    """One batch holding every example of ``micro_batches``, right-padded to the longest ``T``.

    ``input_ids``/``token_type_ids``/... are padded with 0, ``attention_mask`` with 0 and ``labels``
    ``[B, T]`` with -100 (so padding is neither attended to nor supervised); non-tensor values are dropped; 1-D tensors
    (classification ``labels [B]``) are concatenated as they are. A micro-batch without
    ``attention_mask`` gets ones for its real positions.

    Returns:
        ``{key: tensor [sum B_i, max T_i]}``.
    """
    if "input_ids" not in micro_batches[0]:  # images (pixel_values [B, C, H, W], labels [B]): same shapes, stacked
        keys = [k for k, v in micro_batches[0].items() if isinstance(v, torch.Tensor)]
        return {k: torch.cat([mb[k] for mb in micro_batches], dim=0) for k in keys}
    width = max(int(mb["input_ids"].shape[1]) for mb in micro_batches)
    keys = [k for k, v in micro_batches[0].items() if isinstance(v, torch.Tensor)]
    if "attention_mask" not in keys:
        keys.append("attention_mask")
    out: dict[str, torch.Tensor] = {}
    for key in keys:
        parts = []
        for mb in micro_batches:
            t = mb.get(key)
            if t is None and key == "attention_mask":
                t = torch.ones_like(mb["input_ids"])
            if t.dim() >= 2 and t.shape[1] < width:
                pad = torch.full(
                    (t.shape[0], width - t.shape[1], *t.shape[2:]), _PAD.get(key, 0), dtype=t.dtype, device=t.device
                )
                t = torch.cat([t, pad], dim=1)
            parts.append(t)
        out[key] = torch.cat(parts, dim=0)
    return out


def _grads(params: list[tuple[str, nn.Parameter]]) -> dict[str, torch.Tensor | None]:
    return {n: (None if p.grad is None else p.grad.detach().float().cpu().clone()) for n, p in params}


def check_accumulation(
    model: nn.Module, micro_batches: list[dict], atol: float = 1e-5, rtol: float = 1e-4
) -> dict[str, Any]:
    """Accumulated window vs concatenated batch: equal loss and gradients within tolerance.

    The model runs in eval mode (dropout off, so both passes compute the same function); its
    ``.grad`` fields and mode are restored afterwards; no optimizer step is taken.

    Args:
        model: causal LM returning ``.logits [B, T, V]``, or a classifier returning ``.loss``.
        micro_batches: the ``k`` micro-batches of one window; causal LM: ``input_ids``,
            ``attention_mask``, ``labels [B_i, T_i]`` (-100 = not supervised; ``T_i`` may differ);
            classification: ``labels [B_i]``.
        atol, rtol: ``torch.allclose`` tolerances on the loss (nats) and on each gradient tensor.

    Returns:
        ``{"passed", "message", "normalisation", "micro_batches": k, "tokens_per_micro_batch": [n_i],
        "window_tokens": N, "loss_sums": [nats per micro-batch], "loss_accumulated": sum_i s_i / N,
        "loss_concatenated", "loss_mean_of_means": mean_i(s_i / n_i), "loss_abs_diff",
        "grad_tensors": int, "grad_max_abs_diff": float, "grad_mismatches": [names], "atol", "rtol"}``.
        Losses in nats per supervised token (per example for classification). docs/CASES.md C1: sums
        [2.0, 3.0], tokens [1, 3] -> accumulated 1.25, mean of means 1.5.

    Raises:
        TuneproofError: no micro-batch, mixed batch kinds, or a window without supervised tokens.
    """
    if not micro_batches:
        raise TuneproofError("check_accumulation: no micro-batches given")
    kinds = {is_token_batch(mb) for mb in micro_batches}
    if len(kinds) != 1:
        raise TuneproofError(
            "check_accumulation: micro-batches mix causal-LM labels [B, T] and classification labels [B]"
        )
    token = kinds.pop()
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    prior = {n: p.grad for n, p in params}
    was_training = model.training
    try:
        model.eval()
        for _, p in params:
            p.grad = None
        # Token counts first: every micro-batch is divided by the count of the whole window.
        counts = []
        for mb in micro_batches:
            labels = mb["labels"]
            counts.append(int((labels[:, 1:] != IGNORE_INDEX).sum()) if token else int(labels.shape[0]))
        window = sum(counts)
        if window == 0:
            raise TuneproofError(
                "check_accumulation: the window has no supervised tokens",
                hint="use examples whose answer survives truncation (raise training.max_length)",
            )
        sums = []
        for mb in micro_batches:
            s, _ = loss_sum_and_count(model, mb)
            (s / window).backward()  # per-token normalisation over the whole window (docs/CASES.md C1)
            sums.append(float(s.detach()))
        acc = _grads(params)
        for _, p in params:
            p.grad = None
        s_cat, n_cat = loss_sum_and_count(model, concat_micro_batches(micro_batches))
        (s_cat / n_cat).backward()
        cat = _grads(params)
    finally:
        for n, p in params:
            p.grad = prior[n]
        model.train(was_training)

    losses = window_losses(sums, counts)
    loss_acc, loss_cat = losses["per_token"], float(s_cat.detach()) / n_cat
    loss_diff = abs(loss_acc - loss_cat)
    loss_ok = n_cat == window and loss_diff <= atol + rtol * abs(loss_cat)
    mismatches, max_diff = [], 0.0
    for name, _ in params:
        a, b = acc[name], cat[name]
        if a is None and b is None:
            continue
        if a is None or b is None:
            mismatches.append(name)
            continue
        max_diff = max(max_diff, float((a - b).abs().max()) if a.numel() else 0.0)
        if not torch.allclose(a, b, rtol=rtol, atol=atol):
            mismatches.append(name)
    passed = loss_ok and not mismatches
    unit = "token" if token else "example"
    if passed:
        message = (
            f"accumulating {len(micro_batches)} micro-batches ({window} "
            f"supervised {unit}s) equals the concatenated batch: "
            f"loss {loss_acc:.6g} (mean of means would be {losses['mean_of_means']:.6g}), max grad diff {max_diff:.2e}"
        )
    else:
        what = []
        if n_cat != window:
            what.append(f"concatenated batch has {n_cat} supervised {unit}s, window {window}")
        if loss_diff > atol + rtol * abs(loss_cat):
            what.append(f"loss accumulated {loss_acc:.6g} vs concatenated {loss_cat:.6g}")
        if mismatches:
            what.append(
                f"{len(mismatches)} gradient tensors differ (max abs diff {max_diff:.2e}): {', '.join(mismatches[:5])}"
            )
        message = "accumulation differs from the concatenated batch: " + "; ".join(what)
    return {
        "passed": passed,
        "message": message,
        "normalisation": NORMALISATION if token else NORMALISATION_CLASSIFICATION,
        "micro_batches": len(micro_batches),
        "tokens_per_micro_batch": counts,
        "window_tokens": window,
        "loss_sums": sums,
        "loss_accumulated": loss_acc,
        "loss_concatenated": loss_cat,
        "loss_mean_of_means": losses["mean_of_means"],
        "loss_abs_diff": loss_diff,
        "grad_tensors": sum(1 for n in acc if acc[n] is not None),
        "grad_max_abs_diff": max_diff,
        "grad_mismatches": mismatches,
        "atol": atol,
        "rtol": rtol,
    }


def last_window_micro_batches(n: int, micro_batch: int, accumulation: int, world_size: int = 1) -> int:
    """Micro-batches in the last accumulation window of an epoch (per process): ``accumulation``
    when it divides the epoch's micro-batches, else what is left (6 examples, micro-batch 1,
    accumulation 4: 2). See :func:`tuneproof.training.data_order.window_at`."""
    per_epoch = micro_batches_per_epoch(n, micro_batch, world_size)
    return per_epoch - (optimizer_steps_per_epoch(n, micro_batch, accumulation, world_size) - 1) * accumulation


def check_windows(
    model: nn.Module, first: list[dict], last: list[dict] | None = None, **tolerances: float
) -> dict[str, Any]:
    """:func:`check_accumulation` on the first full window and, when an epoch ends in a short
    window, on that last window too (its own per-token normalisation, docs/CASES.md C18).

    Args:
        first: the micro-batches of a full window; last: those of the short last window of an
            epoch, or None when every window is full.
        tolerances: ``atol``/``rtol`` passed on.

    Returns:
        The result of the first window (same keys as :func:`check_accumulation`), with ``passed``
        and ``message`` covering both, plus ``last_window``: the last window's result or None.
    """
    r = check_accumulation(model, first, **tolerances)
    r_last = check_accumulation(model, last, **tolerances) if last else None
    out = {**r, "last_window": r_last}
    if r_last is None:
        out["message"] = r["message"] + "; every window of an epoch is full"
        return out
    out["passed"] = bool(r["passed"] and r_last["passed"])
    k = r_last["micro_batches"]
    out["message"] = (
        f"{r['message']}; last window of an epoch ({k} micro-batch{'' if k == 1 else 'es'}, "
        f"{r_last['window_tokens']} supervised): " + r_last["message"]
    )
    return out


# --------------------------------------------------------------------------- the preflight's check
def training_micro_batch(encoded: list, size: int, seed: int, index: int, pad_id: int) -> dict:
    """Micro-batch number ``index`` of the training order (``training.loop.micro_batch_indices``) at
    ``size`` examples, collated (``[B, T]`` tensors)."""
    idx = micro_batch_indices(len(encoded), size, seed, index)
    return collate([encoded[i] for i in idx], pad_id)


def last_window_probe(encoded: list, cfg, size: int, pad_id: int) -> list[dict] | None:
    """The short last accumulation window of epoch 0, or None when the epoch's windows are all full:
    its real micro-batches (the examples training puts there), each cut to its first ``size``
    examples to keep the probe cheap. ``cfg``: the study's ``training`` section."""
    n, mb, accum = len(encoded), cfg.micro_batch_size, cfg.gradient_accumulation_steps
    if last_window_micro_batches(n, mb, accum) == accum:
        return None
    window = window_at(n, mb, accum, cfg.seed, optimizer_steps_per_epoch(n, mb, accum) - 1)
    return [collate([encoded[i] for i in idx[:size]], pad_id) for idx in window]


def accumulation_probes(usable: list, cfg, pad: int, probe_micro_batch: int) -> tuple[list[dict], list[dict] | None]:
    """The micro-batches of the gradient accumulation check: ``max(2, accumulation)`` windows of at
    most ``probe_micro_batch`` real train examples, and the short last window of an epoch when there
    is one (docs/CASES.md C18)."""
    k = max(2, cfg.gradient_accumulation_steps)
    size = max(1, min(probe_micro_batch, len(usable) // k))
    windows = [training_micro_batch(usable, size, cfg.seed, i, pad) for i in range(k)]
    return windows, last_window_probe(usable, cfg, size, pad)


def check_accumulation_window(
    model: nn.Module, micro_batches: list[dict], configured: int, last_window: list[dict] | None = None
) -> dict[str, Any]:
    """The preflight's ``gradient accumulation`` check: accumulated real micro-batches equal their
    concatenation (docs/CASES.md C1), and so does the short last window of an epoch when there is one
    (docs/CASES.md C18); the normalisation is stored. ``configured``: ``training.gradient_accumulation_steps``."""
    r = check_windows(model, micro_batches, last_window)
    last = r["last_window"]
    numbers = {
        "micro_batches": r["micro_batches"],
        "configured_accumulation": configured,
        "last_window_micro_batches": last["micro_batches"] if last else None,
        "last_window_tokens": last["tokens_per_micro_batch"] if last else None,
        "tokens_per_micro_batch": r["tokens_per_micro_batch"],
        "loss_accumulated": round(r["loss_accumulated"], 6),
        "loss_concatenated": round(r["loss_concatenated"], 6),
        "loss_mean_of_means": round(r["loss_mean_of_means"], 6),
        "grad_max_abs_diff": r["grad_max_abs_diff"],
        "atol": r["atol"],
        "rtol": r["rtol"],
    }
    return check_result(
        "gradient accumulation",
        bool(r["passed"]),
        r["message"] + f"; normalisation: {r['normalisation']}",
        numbers,
        r,
        normalisation=r["normalisation"],
    )
