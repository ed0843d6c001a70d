"""Token-level causal-LM loss, normalised per supervised token over the accumulation window.

docs/CASES.md C1: with gradient accumulation the loss of one optimizer update is the mean over every
supervised token of the whole window, ``sum(token losses) / sum(supervised tokens)``, not the
mean of the per-micro-batch means. Each micro-batch therefore contributes
``sum_of_its_token_losses / window_token_count``; summing these over the window gives the
update's loss, and the gradients equal those of the concatenated batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tuneproof.data.preprocess import IGNORE_INDEX
from tuneproof.training import micro_batch

NORMALISATION = "per-token mean over the accumulation window (sum of token losses / supervised tokens in the window)"


def supervised_token_count(labels: torch.Tensor) -> int:
    """Number of supervised positions in ``labels`` (shape ``[batch, seq]``), i.e. after the causal shift."""
    return int((labels[:, 1:] != IGNORE_INDEX).sum().item())


def supervised_count(batch: dict[str, torch.Tensor]) -> int:
    """What a micro-batch's loss sum is normalised by: supervised tokens after the causal shift
    (``labels [B, T]``), or examples for classification (``labels [B]``). The window's count is
    the sum over its micro-batches (docs/CASES.md C1)."""
    labels = batch["labels"]
    return int((labels[:, 1:] != -100).sum()) if labels.dim() == 2 else int(labels.numel())


def token_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum of next-token cross-entropy over supervised positions.

    Args:
        logits: ``[batch, seq, vocab]`` (any float dtype; computed in fp32).
        labels: ``[batch, seq]`` token ids, ``IGNORE_INDEX`` (-100) where not supervised. Position
            ``t`` of ``labels`` is predicted from logits at ``t - 1`` (the causal shift is done here).

    Returns:
        A scalar tensor: the summed loss in nats (0 when nothing is supervised).
    """
    # the labels are shifted, not the logits: ``logits[:, :-1]`` is not contiguous and its reshape
    # copied the whole [batch, seq, vocab] tensor (and its gradient) at every step; the last
    # position gets IGNORE_INDEX. The same terms (gradients bitwise equal; the summed loss within
    # fp32 summation order, ~1e-7 relative), as transformers' ``ForCausalLMLoss`` does it.
    shift_labels = F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX)
    return F.cross_entropy(
        logits.float().reshape(-1, logits.size(-1)),
        shift_labels.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )


def window_losses(micro_batch_sums: list[float], micro_batch_tokens: list[int]) -> dict[str, float]:
    """The update's loss under both normalisations, for the record (docs/CASES.md C1).

    Args:
        micro_batch_sums: summed token loss of each micro-batch of the window (nats).
        micro_batch_tokens: supervised tokens of each micro-batch.

    Returns:
        ``{"per_token": sum(sums)/sum(tokens), "mean_of_means": mean(sums_i/tokens_i)}``.
        Example: sums [2.0, 3.0], tokens [1, 3] -> per_token 1.25, mean_of_means 1.5.
    """
    total = sum(micro_batch_tokens)
    per_token = sum(micro_batch_sums) / total if total else float("nan")
    means = [s / t for s, t in zip(micro_batch_sums, micro_batch_tokens) if t]
    return {"per_token": per_token, "mean_of_means": sum(means) / len(means) if means else float("nan")}


# ------------------------------------------ chunked loss (docs/PROTOCOL.md step 5, tests/training/test_chunked_loss.py)
#: fp32 logits of one chunk of the chunked loss, bytes: 32 MiB, 170 positions of a 49,152-word vocabulary
#: (SmolLM2). Measured on SmolLM2-135M + LoRA, 4 x 512 tokens: chunks of 1024 positions (200 MB of
#: logits, three copies live: logits, log-softmax, their gradient) left the step peak only 18.7 %
#: lower than the full logits; chunks of this size leave only the model's own activations.
CHUNK_BYTES = 32 * 2**20


def chunk_positions(vocab: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    """Supervised positions per chunk: ``chunk_bytes`` of fp32 logits ``[positions, vocab]``, at least 1."""
    return max(1, chunk_bytes // (4 * max(1, int(vocab))))


#: the chunked loss must match the reference within these (fp32; relative to the reference's scale)
CHUNKED_LOSS_RTOL = 1e-5
CHUNKED_GRAD_RTOL = 1e-4


def backbone_and_head(model):
    """``(decoder, lm_head)`` of a causal LM, PEFT-wrapped or not (transformers' ``get_decoder`` /
    ``get_output_embeddings``); LoRA layers injected in either stay in place."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder = base.get_decoder() if hasattr(base, "get_decoder") else None
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    if decoder is None or head is None:
        raise TypeError(f"{type(base).__name__} exposes no decoder / output embeddings for the chunked loss")
    return decoder, head


def _chunk_ce(hidden: torch.Tensor, labels: torch.Tensor, head: torch.nn.Module) -> torch.Tensor:
    return F.cross_entropy(head(hidden).float(), labels, reduction="sum")


def chunked_token_loss_sum(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    labels: torch.Tensor,
    chunk_tokens: int | None = None,
    position_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """The same sum as :func:`token_loss_sum` without materialising the ``[batch, seq, vocab]`` logits.

    The decoder's last hidden states ``[batch, seq, hidden]`` are shifted like the labels, only the
    supervised positions are kept, and the output head + cross-entropy run over chunks of
    ``chunk_tokens`` positions under activation checkpointing (``torch.utils.checkpoint``,
    non-reentrant): each chunk's logits exist only while it is computed, in the forward and again in
    the backward. Peak memory of the loss falls from ``O(batch * seq * vocab)`` to
    ``O(chunk_tokens * vocab)``. The idea is that of Liger-Kernel's fused linear cross-entropy and
    of Wijmans et al. 2024, "Cut Your Losses in Large-Vocabulary Language Models" (arXiv:2411.09009).

    It bypasses the model's own ``forward`` after the decoder, so a model that post-processes the
    logits (soft-capping, a logit scale) gives another loss: :func:`check_chunked_loss` compares
    both on a real micro-batch before a run may use it.

    Args:
        input_ids, labels: ``[batch, seq]``; attention_mask: ``[batch, seq]``, or None for packed
            rows, which pass ``position_ids`` ``[batch, seq]`` instead (restarting at 0 per
            example: the model's own mask builder keeps the examples apart, as in
            :func:`tuneproof.data.preprocess.collate_packed`).
        chunk_tokens: supervised positions per chunk (None: :func:`chunk_positions` of the head's vocabulary,
            ``CHUNK_BYTES`` of fp32 logits per chunk).

    Returns:
        A scalar tensor: the summed loss in nats over supervised positions.
    """
    from torch.utils.checkpoint import checkpoint  # noqa: PLC0415 - torch.utils.checkpoint loads only when chunked_token_loss_sum() runs

    decoder, head = backbone_and_head(model)
    if position_ids is not None:
        hidden = decoder(input_ids=input_ids, position_ids=position_ids, use_cache=False).last_hidden_state
    else:
        hidden = decoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    h = hidden[:, :-1, :].reshape(-1, hidden.size(-1))
    y = labels[:, 1:].reshape(-1)
    keep = (y != IGNORE_INDEX).nonzero(as_tuple=True)[0]
    h, y = h.index_select(0, keep), y.index_select(0, keep)
    chunk_tokens = chunk_tokens or chunk_positions(head.weight.shape[0])
    total = hidden.new_zeros((), dtype=torch.float32)
    for s in range(0, h.size(0), chunk_tokens):
        total = total + checkpoint(
            _chunk_ce, h[s : s + chunk_tokens], y[s : s + chunk_tokens], head, use_reentrant=False
        )
    return total


def check_chunked_loss(model, batch: dict[str, torch.Tensor], chunk_tokens: int | None = None) -> dict:
    """Compare the chunked loss with the reference (full logits, :func:`token_loss_sum`) on one
    micro-batch: summed loss and every trainable gradient.

    Returns:
        ``{"passed", "loss_reference", "loss_chunked", "loss_rel_diff", "grad_max_rel_diff",
        "tensors", "rtol": {"loss", "grad"}, "message"}``; gradients are compared as
        ``max|g_chunked - g_ref| / max|g_ref|`` over all trainable tensors. Gradients are cleared
        before and after.
    """
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    model.zero_grad(set_to_none=True)
    inputs = micro_batch.model_inputs(batch)  # what training gives the model (packed rows: position ids, no mask)
    ref = token_loss_sum(micro_batch.logits(model, batch), batch["labels"])
    ref.backward()
    g_ref = {n: p.grad.detach().clone() for n, p in params if p.grad is not None}
    model.zero_grad(set_to_none=True)
    try:
        got = chunked_token_loss_sum(
            model,
            inputs["input_ids"],
            inputs.get("attention_mask"),
            batch["labels"],
            chunk_tokens,
            position_ids=inputs.get("position_ids"),
        )
    except TypeError as err:
        return {"passed": False, "message": f"chunked loss not available: {err}"}
    got.backward()
    g_got = {n: p.grad.detach().clone() for n, p in params if p.grad is not None}
    model.zero_grad(set_to_none=True)
    scale = max((float(g.abs().max()) for g in g_ref.values()), default=0.0) or 1.0
    grad_diff = max((float((g_got[n] - g).abs().max()) / scale for n, g in g_ref.items() if n in g_got), default=0.0)
    missing = sorted(set(g_ref) ^ set(g_got))
    loss_diff = abs(float(got) - float(ref)) / max(abs(float(ref)), 1e-12)
    passed = not missing and loss_diff <= CHUNKED_LOSS_RTOL and grad_diff <= CHUNKED_GRAD_RTOL
    message = (
        f"chunked loss equals the reference: loss rel. diff {loss_diff:.1e} (<= {CHUNKED_LOSS_RTOL:g}), "
        f"gradients max rel. diff {grad_diff:.1e} (<= {CHUNKED_GRAD_RTOL:g}) over {len(g_ref)} tensors"
        if passed
        else f"chunked loss differs from the reference: loss rel. diff {loss_diff:.1e}, gradients {grad_diff:.1e}"
        + (f", gradients present in only one of them: {missing[:3]}" if missing else "")
        + " - the model post-processes its logits or has no plain output head; leave training.chunked_loss off"
    )
    return {
        "passed": passed,
        "loss_reference": float(ref),
        "loss_chunked": float(got),
        "loss_rel_diff": loss_diff,
        "grad_max_rel_diff": grad_diff,
        "tensors": len(g_ref),
        "rtol": {"loss": CHUNKED_LOSS_RTOL, "grad": CHUNKED_GRAD_RTOL},
        "message": message,
    }
