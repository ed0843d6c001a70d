"""Data order and its distribution across processes (docs/CASES.md C10).

One rule for every run, single-process or DistributedDataParallel: each epoch is a permutation of
the training examples seeded with ``seed + epoch``, split across ``world_size`` processes the way
``torch.utils.data.DistributedSampler`` does (shuffle, pad to a multiple of ``world_size`` by
repeating the first indices, then process ``rank`` takes every ``world_size``-th index starting at
``rank``). Each process then cuts its share into micro-batches of ``micro_batch`` examples.

Consequences a user must know (docs/PROTOCOL.md step 6: the split of the data across processes must be set up):

- with ``world_size`` processes an epoch is ``ceil(n / world_size / micro_batch)`` steps per
  process, not ``ceil(n / micro_batch)``: 16,000 examples, micro-batch 8, 2 processes gives 1,000
  steps per process per epoch, not 2,000;
- the shares of the processes are disjoint and together cover every example (when ``n`` is not a
  multiple of ``world_size`` a few examples are repeated to even the shares, as the sampler does);
- the order changes between epochs (``DistributedSampler.set_epoch``) and is a pure function of
  ``(n, seed, epoch, world_size, rank)``, so a resumed run sees exactly the data it would have seen;
- an accumulation window (the micro-batches of one optimizer step) never crosses an epoch boundary:
  an epoch is ``ceil(micro-batches per epoch / accumulation)`` optimizer steps and its last window
  holds only the micro-batches left (6 examples, micro-batch 1, accumulation 4: windows of 4 and 2
  micro-batches, 2 optimizer steps per epoch; docs/CASES.md C18). :func:`window_at` maps a global optimizer
  step to its micro-batches, the data position a checkpoint's step stands for.

Length grouping (``training.length_grouping: true``, tests/training/test_length_grouping_packing.py): the same per-rank
share of the same epoch permutation, reordered so that a micro-batch holds examples of similar length (less
padding). The share is cut into *megabatches* of :data:`GROUP_MEGABATCH` micro-batches in
sampler order; each megabatch is sorted by length (longest first, ties in sampler order) and cut
into micro-batches; the micro-batches of the epoch are then shuffled with a generator seeded
``seed + epoch`` (so a long micro-batch is not always first and the order changes per epoch). Only
the order inside a rank's share changes: shares stay disjoint and covering, the micro-batch
count per epoch is unchanged (the one short micro-batch, when any, is the last of the last
megabatch), and the order is a pure function of ``(lengths, seed, epoch, world_size, rank)``,
so exact resume holds. Source: transformers ``LengthGroupedSampler`` (megabatches of 50 batches
sorted by length), with the batch order shuffled as in the "bucketing" of torchtext's
``BucketIterator``.

Source: ``torch.utils.data.distributed.DistributedSampler`` (PyTorch documentation: "calling the
set_epoch() method at the beginning of each epoch before creating the DataLoader iterator is
necessary to make shuffling work properly across multiple epochs").
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.utils.data.distributed import DistributedSampler

from tuneproof.training.budget import check_shape, micro_batches_per_epoch, optimizer_steps_per_epoch

#: Micro-batches per megabatch of the length-grouped order (the window of examples sorted together).
GROUP_MEGABATCH = 64


def epoch_order(n: int, *, world_size: int = 1, rank: int = 0, seed: int = 0, epoch: int = 0) -> list[int]:
    """Example indices process ``rank`` reads in ``epoch``, in order (``DistributedSampler`` with
    ``shuffle=True, drop_last=False`` after ``set_epoch(epoch)``). Length ``ceil(n / world_size)``."""
    check_shape(n, 1, world_size, rank)
    sampler = DistributedSampler(range(n), num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=False)
    sampler.set_epoch(epoch)
    return list(sampler)


def window_position(n: int, micro_batch: int, accumulation: int, step: int, world_size: int = 1) -> dict[str, int]:
    """Where 0-based optimizer step ``step`` reads: ``{"epoch", "window" (0-based within the epoch),
    "first_micro_batch" (global micro-batch index, counted across epochs), "micro_batches"}`` (per process).

    Example: n 6, micro-batch 1, accumulation 4: step 0 -> epoch 0, micro-batches 0-3; step 1 ->
    epoch 0, micro-batches 4-5 (2, the rest of the epoch); step 2 -> epoch 1, micro-batches 6-9.
    """
    per_epoch = micro_batches_per_epoch(n, micro_batch, world_size)
    epoch, window = divmod(step, optimizer_steps_per_epoch(n, micro_batch, accumulation, world_size))
    first = window * accumulation
    return {
        "epoch": epoch,
        "window": window,
        "first_micro_batch": epoch * per_epoch + first,
        "micro_batches": min(accumulation, per_epoch - first),
    }


def epoch_micro_batches(
    n: int,
    micro_batch: int,
    seed: int,
    epoch: int,
    *,
    world_size: int = 1,
    rank: int = 0,
    lengths: Sequence[int] | None = None,
) -> list[list[int]]:
    """The micro-batches (lists of example indices) of process ``rank`` in ``epoch``, in order.

    Args:
        lengths: token length of every example (``len(lengths) == n``) to group micro-batches by
            length (module docstring, "Length grouping"); None: the sampler order cut in order.

    Returns:
        ``micro_batches_per_epoch(n, micro_batch, world_size)`` lists; at most one is short.

    Raises:
        ValueError: as :func:`distributed_indices`, or ``len(lengths) != n``.
    """
    check_shape(n, micro_batch, world_size, rank)
    order = epoch_order(n, world_size=world_size, rank=rank, seed=seed, epoch=epoch)
    if lengths is None:
        return [order[i : i + micro_batch] for i in range(0, len(order), micro_batch)]
    if len(lengths) != n:
        raise ValueError(f"lengths has {len(lengths)} entries for {n} examples")
    mega = GROUP_MEGABATCH * micro_batch
    batches: list[list[int]] = []
    for start in range(0, len(order), mega):
        chunk = sorted(order[start : start + mega], key=lambda i: -lengths[i])  # stable: ties keep sampler order
        batches.extend(chunk[j : j + micro_batch] for j in range(0, len(chunk), micro_batch))
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    return [batches[k] for k in torch.randperm(len(batches), generator=g).tolist()]


def padding_share(micro_batches: Sequence[Sequence[int]], lengths: Sequence[int]) -> float:
    """Padded positions / all positions when each micro-batch is right-padded to its longest
    example (what :func:`tuneproof.data.preprocess.collate` builds). A fraction in [0, 1)."""
    positions = sum(len(b) * max(lengths[i] for i in b) for b in micro_batches if b)
    real = sum(lengths[i] for b in micro_batches for i in b)
    return 0.0 if positions == 0 else 1 - real / positions


def window_at(
    n: int,
    micro_batch: int,
    accumulation: int,
    seed: int,
    step: int,
    *,
    world_size: int = 1,
    rank: int = 0,
    lengths: Sequence[int] | None = None,
) -> list[list[int]]:
    """The micro-batches (lists of example indices) of this process for 0-based optimizer step ``step``.

    Args:
        n, micro_batch, world_size, rank, seed: as :func:`distributed_indices`.
        accumulation: micro-batches per optimizer step (``training.gradient_accumulation_steps``).
        step: global optimizer step (0-based, counted across epochs).
        lengths: example lengths for the length-grouped order (:func:`epoch_micro_batches`), or None.

    Returns:
        ``accumulation`` lists, or fewer for the last window of an epoch (:func:`window_position`).
    """
    pos = window_position(n, micro_batch, accumulation, step, world_size)
    batches = epoch_micro_batches(n, micro_batch, seed, pos["epoch"], world_size=world_size, rank=rank, lengths=lengths)
    first = pos["first_micro_batch"] - pos["epoch"] * micro_batches_per_epoch(n, micro_batch, world_size)
    return batches[first : first + pos["micro_batches"]]


def distributed_indices(n: int, micro_batch: int, world_size: int, rank: int, seed: int, epoch: int) -> list[list[int]]:
    """The micro-batches (lists of example indices) of process ``rank`` in ``epoch``.

    Args:
        n: training examples.
        micro_batch: examples per forward/backward pass, per process.
        world_size: number of processes; rank: this process, ``0 <= rank < world_size``.
        seed: the run's ``training.seed``; epoch: 0-based epoch.

    Returns:
        ``micro_batches_per_epoch(n, micro_batch, world_size)`` lists; the last one may be short.

    Raises:
        ValueError: ``n < 1``, ``micro_batch < 1`` or a rank outside ``[0, world_size)``.
    """
    check_shape(n, micro_batch, world_size, rank)
    order = epoch_order(n, world_size=world_size, rank=rank, seed=seed, epoch=epoch)
    return [order[i : i + micro_batch] for i in range(0, len(order), micro_batch)]


def micro_batch_at(
    n: int,
    micro_batch: int,
    seed: int,
    index: int,
    *,
    world_size: int = 1,
    rank: int = 0,
    lengths: Sequence[int] | None = None,
) -> list[int]:
    """Example indices of this process's global micro-batch number ``index`` (0-based, counted
    across epochs): the data position a checkpoint's global step maps to. ``lengths``: as
    :func:`epoch_micro_batches` (length-grouped order)."""
    epoch, k = divmod(index, micro_batches_per_epoch(n, micro_batch, world_size))
    return epoch_micro_batches(n, micro_batch, seed, epoch, world_size=world_size, rank=rank, lengths=lengths)[k]
