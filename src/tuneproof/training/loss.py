"""Token-level causal-LM loss, normalised per supervised token over the accumulation window.

CASES C1: with gradient accumulation the loss of one optimizer update is the mean over every
supervised token of the whole window, ``sum(token losses) / sum(supervised tokens)``, not the
mean of the per-micro-batch means. Each micro-batch therefore contributes
``sum_of_its_token_losses / window_token_count``; summing these over the window gives the
update's loss, and the gradients equal those of the concatenated batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100
NORMALISATION = "per-token mean over the accumulation window (sum of token losses / supervised tokens in the window)"


def supervised_token_count(labels: torch.Tensor) -> int:
    """Number of supervised positions in ``labels`` (shape ``[batch, seq]``), i.e. after the causal shift."""
    return int((labels[:, 1:] != IGNORE_INDEX).sum().item())


def token_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum of next-token cross-entropy over supervised positions.

    Args:
        logits: ``[batch, seq, vocab]`` (any float dtype; computed in fp32).
        labels: ``[batch, seq]`` token ids, ``IGNORE_INDEX`` (-100) where not supervised. Position
            ``t`` of ``labels`` is predicted from logits at ``t - 1`` (the causal shift is done here).

    Returns:
        A scalar tensor: the summed loss in nats (0 when nothing is supervised).
    """
    shift_logits = logits[:, :-1, :].float()
    shift_labels = labels[:, 1:]
    return F.cross_entropy(
        shift_logits.reshape(-1, shift_logits.size(-1)), shift_labels.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum"
    )


def window_losses(micro_batch_sums: list[float], micro_batch_tokens: list[int]) -> dict[str, float]:
    """The update's loss under both normalisations, for the record (CASES C1).

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
