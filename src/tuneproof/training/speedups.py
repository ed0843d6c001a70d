"""Speed-ups of the training loop that change how micro-batches are laid out, never what is
computed (issue 15): length grouping (:func:`tuneproof.training.distributed.epoch_micro_batches`)
and padding-free packing (:func:`tuneproof.data.preprocess.collate_packed`). Packing is used only
after :func:`tuneproof.preflight.packing.check_packing` passed on real training examples; the run
summary records it under ``speedups`` and the padding share under ``padding``.
"""

from __future__ import annotations

from typing import Any

from tuneproof.errors import CheckFailed


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
    from tuneproof.data.preprocess import packed_padding  # noqa: PLC0415
    from tuneproof.training.distributed import epoch_micro_batches  # noqa: PLC0415

    n, mb = len(train_set), cfg.micro_batch_size
    lengths = [len(e.input_ids) for e in train_set]
    grouping, packing = bool(getattr(cfg, "length_grouping", False)), bool(getattr(cfg, "packing", False))
    plain = epoch_micro_batches(n, mb, cfg.seed, epoch, world_size=world_size, rank=rank)
    used = epoch_micro_batches(n, mb, cfg.seed, epoch, world_size=world_size, rank=rank, lengths=lengths) if grouping else plain
    tokens = sum(lengths[i] for b in plain for i in b)

    def positions(batches, packed: bool) -> int:
        if packed:
            return sum(packed_padding([lengths[i] for i in b], packing_capacity(cfg))[1] for b in batches)
        return sum(len(b) * max(lengths[i] for i in b) for b in batches)

    before, after = positions(plain, False), positions(used, packing)
    layout = "+".join(k for k, on in (("length_grouping", grouping), ("packing", packing)) if on) or "padded"
    return {"before": round(1 - tokens / before, 6), "after": round(1 - tokens / after, 6), "layout": layout, "epoch": epoch,
            "positions_before": before, "positions_after": after, "tokens": tokens}


def prove_packing(model, train_set: list, cfg, pad_id: int, device) -> dict[str, Any]:
    """Run the packing check on real training examples before packing is used.

    Returns:
        what the summary's ``speedups.packing`` records: ``max_abs_diff``, ``control_max_abs_diff``,
        ``tokens``, ``rows``, ``examples``, ``atol``.

    Raises:
        CheckFailed: classification examples, or the packed rows differ from the examples alone.
    """
    from tuneproof.preflight.packing import check_packing, packing_sample  # noqa: PLC0415

    if not train_set or train_set[0].class_index is not None or not train_set[0].labels:
        raise CheckFailed("training.packing applies to causal LMs (token labels), not to sequence classification",
                          hint="set training.packing: false")
    sample = packing_sample(train_set, cfg.micro_batch_size)
    if len(sample) < 2:
        raise CheckFailed("training.packing needs at least 2 training examples", hint="set training.packing: false")
    check = check_packing(model, sample, pad_id, packing_capacity(cfg))
    if not check["passed"]:
        raise CheckFailed(f"training.packing: {check['message']}", hint="set training.packing: false")
    return {k: check[k] for k in ("max_abs_diff", "control_max_abs_diff", "tokens", "rows", "examples", "atol")}
