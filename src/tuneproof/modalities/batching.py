"""Batches of the evaluation procedure, shared by the modalities: example positions in length order,
so a batch wastes little padding, and the padding that order leaves (the outputs are put back in
the original order by the caller; ``tests/evaluation/test_eval_sorted_batches.py`` checks that they
equal those of the unsorted batches and of one example at a time)."""

from __future__ import annotations


def length_sorted_batches(lengths: list[int], batch_size: int, sort: bool = True) -> list[list[int]]:
    """Batches of example positions: ``batch_size`` consecutive positions of the order sorted by
    length (stable: ties keep the input order), or of the input order with ``sort=False``."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i]) if sort else list(range(len(lengths)))
    return [order[s : s + batch_size] for s in range(0, len(order), batch_size)]


def padded_positions(lengths: list[int], batches: list[list[int]]) -> int:
    """Padding positions when each batch is padded to its longest member."""
    return sum(len(b) * max(lengths[i] for i in b) - sum(lengths[i] for i in b) for b in batches if b)
