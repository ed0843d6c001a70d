"""Padding-free packing without cross-contamination (``training.packing``, docs/CASES.md C23): the check the loop
runs on real training examples before it packs, and the preflight's "packing" check runs too.

Packing lays several examples end to end in one row (:func:`tuneproof.data.preprocess.collate_packed`).
It is sound only if no token can attend to another example of its row: the per-token losses of a
packed row must then equal those of each example run alone. A packed row whose mask lets an example
see its neighbour (an attention implementation or a model that ignores ``position_ids``, a cache that
disables the packed-sequence detection, a plain causal mask over the row) gives the second example
different losses. The check computes both and compares them token by token, and proves its own power
on the same rows: the same row run with a plain causal mask over it (the neighbour visible) must
differ, or the check cannot see contamination on this model and fails.

Source of the rule: Krell et al., "Efficient Sequence Packing without Cross-contamination" (2021);
transformers ``DataCollatorWithFlattening`` (position ids restarting per example, no attention mask)
and ``masking_utils.find_packed_sequence_indices`` (a new sequence wherever a position id is not the
previous one + 1; used when the model is called with ``position_ids``, ``attention_mask=None`` and
no cache).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from tuneproof.data.preprocess import IGNORE_INDEX, collate, collate_packed, pack_rows
from tuneproof.training import micro_batch

#: Largest |per-token loss packed - alone| accepted, in nats (fp32; the sdpa/eager kernels reorder sums).
PACKING_ATOL = 1e-4


def packed_forward(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """How training runs a micro-batch, packed or not: the loop's own :func:`tuneproof.training.micro_batch.logits`,
    looked up when called (packed rows: position ids, no attention mask, no cache). ``logits [R, W, V]``."""
    return micro_batch.logits(model, batch)


def neighbour_visible_forward(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The contaminated control: the same row under a plain causal mask over the whole row (each
    example can attend to the ones before it), position ids still restarting per example."""
    return model(
        input_ids=batch["input_ids"],
        position_ids=batch["position_ids"],
        attention_mask=batch["attention_mask"].new_ones(batch["attention_mask"].shape),
        use_cache=False,
    ).logits


def _token_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-position loss after the causal shift, ``[B, T-1]``, 0 where unsupervised."""
    return F.cross_entropy(
        logits[:, :-1].float().transpose(1, 2), labels[:, 1:], ignore_index=IGNORE_INDEX, reduction="none"
    )


def check_packing(
    model,
    examples: list,
    pad_id: int,
    capacity: int,
    *,
    forward: Callable[[Any, dict], torch.Tensor] | None = None,
    control: Callable[[Any, dict], torch.Tensor] | None = neighbour_visible_forward,
    atol: float = PACKING_ATOL,
) -> dict[str, Any]:
    """Per-token losses of packed rows vs each example alone (docs/CASES.md C23).

    Args:
        model: a causal LM (PEFT-wrapped or not); run in eval mode without gradients, then restored.
        examples: encoded examples (:class:`tuneproof.data.preprocess.Encoded`), at least 2.
        capacity: row capacity in tokens (``training.max_length``); when no row would hold two of
            these examples, one row holding them all is checked instead (the mechanism is the same).
        forward: how a packed batch is run (default :func:`packed_forward`: the training loop's own micro-batch
            function, which also runs each example alone).
        control: the contaminated variant that must be seen to differ (None: not run).
        atol: largest accepted absolute difference of one token's loss (nats).

    Returns:
        ``{"passed", "max_abs_diff", "tokens", "rows", "examples", "worst_example", "control_max_abs_diff",
        "atol", "message"}``.

    Raises:
        ValueError: fewer than 2 examples, or classification examples.
    """
    if len(examples) < 2:
        raise ValueError("the packing check needs at least 2 examples")
    lengths = [len(e.input_ids) for e in examples]
    if all(len(r) == 1 for r in pack_rows(lengths, capacity)):
        capacity = sum(lengths)
    rows = pack_rows(lengths, capacity)
    packed = collate_packed(examples, pad_id, capacity)
    device = next(model.parameters()).device
    packed = {k: v.to(device) for k, v in packed.items()}
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            alone = []
            for e in examples:
                b = {k: v.to(device) for k, v in collate([e], pad_id).items()}
                alone.append(_token_losses(packed_forward(model, b), b["labels"])[0])
            got = _token_losses((forward or packed_forward)(model, packed), packed["labels"])
            ctrl = _token_losses(control(model, packed), packed["labels"]) if control is not None else None
    finally:
        model.train(was_training)

    def diffs(per_token: torch.Tensor) -> list[float]:
        out = [0.0] * len(examples)
        for r, members in enumerate(rows):
            at = 0
            for i in members:
                n = lengths[i]
                # packed position at+j predicts token at+j+1, as alone position j predicts j+1 (j < n-1)
                seg = per_token[r, at : at + n - 1]
                sup = examples_sup[i]
                out[i] = float((seg - alone[i]).abs()[sup].max()) if bool(sup.any()) else 0.0
                at += n
        return out

    examples_sup = [torch.tensor(e.labels[1:], device=device) != IGNORE_INDEX for e in examples]
    per_ex = diffs(got)
    worst = max(range(len(examples)), key=lambda i: per_ex[i])
    max_diff = per_ex[worst]
    ctrl_diff = max(diffs(ctrl)) if ctrl is not None else None
    tokens = int(sum(int(s.sum()) for s in examples_sup))
    passed = max_diff <= atol and (ctrl_diff is None or ctrl_diff > atol)
    multi = sum(1 for r in rows if len(r) > 1)
    if max_diff > atol:
        message = (
            f"packed rows differ from the examples run alone: max |loss diff| {max_diff:.2e} nats > {atol:g} "
            f"(example {getattr(examples[worst], 'id', worst)}): tokens attend across examples of a row; "
            "leave training.packing off (the attention implementation must honour position_ids)"
        )
    elif ctrl_diff is not None and ctrl_diff <= atol:
        message = (
            f"the check cannot see contamination on this model: a row whose examples see each other gives the same "
            f"losses (max diff {ctrl_diff:.2e}); leave training.packing off"
        )
    else:
        message = (
            f"packed = alone on {tokens} supervised tokens of {len(examples)} examples in {len(rows)} rows "
            f"({multi} holding several): max |loss diff| {max_diff:.2e} nats <= {atol:g}"
            + (f"; a row whose examples see each other differs by {ctrl_diff:.2e}" if ctrl_diff is not None else "")
        )
    return {
        "passed": passed,
        "max_abs_diff": max_diff,
        "tokens": tokens,
        "rows": len(rows),
        "examples": len(examples),
        "worst_example": getattr(examples[worst], "id", worst),
        "control_max_abs_diff": ctrl_diff,
        "atol": atol,
        "message": message,
    }


def packing_sample(encoded: list, micro_batch: int, pool: int = 256) -> list:
    """The examples the check packs: the ``max(2, micro_batch)`` shortest of the first ``pool``
    (short ones share rows, so the rows hold several examples)."""
    head = encoded[:pool]
    order = sorted(range(len(head)), key=lambda i: (len(head[i].input_ids), i))
    return [head[i] for i in sorted(order[: max(2, micro_batch)])]
