"""Data order and its distribution across processes (CASES C10).

One rule for every run, single-process or DistributedDataParallel: each epoch is a permutation of
the training examples seeded with ``seed + epoch``, split across ``world_size`` processes the way
``torch.utils.data.DistributedSampler`` does (shuffle, pad to a multiple of ``world_size`` by
repeating the first indices, then process ``rank`` takes every ``world_size``-th index starting at
``rank``). Each process then cuts its share into micro-batches of ``micro_batch`` examples.

Consequences a user must know (protocol step 6: "the data distribution must be configured"):

- with ``world_size`` processes an epoch is ``ceil(n / world_size / micro_batch)`` steps per
  process, not ``ceil(n / micro_batch)``: 16,000 examples, micro-batch 8, 2 processes gives 1,000
  steps per process per epoch, not 2,000;
- the shares of the processes are disjoint and together cover every example (when ``n`` is not a
  multiple of ``world_size`` a few examples are repeated to even the shares, as the sampler does);
- the order changes between epochs (``DistributedSampler.set_epoch``) and is a pure function of
  ``(n, seed, epoch, world_size, rank)``, so a resumed run sees exactly the data it would have seen.

Source: ``torch.utils.data.distributed.DistributedSampler`` (PyTorch documentation: "calling the
set_epoch() method at the beginning of each epoch before creating the DataLoader iterator is
necessary to make shuffling work properly across multiple epochs").
"""

from __future__ import annotations

import math

from torch.utils.data.distributed import DistributedSampler


def _check(n: int, micro_batch: int, world_size: int, rank: int) -> None:
    if n < 1:
        raise ValueError(f"n must be >= 1 (got {n})")
    if micro_batch < 1:
        raise ValueError(f"micro_batch must be >= 1 (got {micro_batch})")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")


def epoch_order(n: int, *, world_size: int = 1, rank: int = 0, seed: int = 0, epoch: int = 0) -> list[int]:
    """Example indices process ``rank`` reads in ``epoch``, in order (``DistributedSampler`` with
    ``shuffle=True, drop_last=False`` after ``set_epoch(epoch)``). Length ``ceil(n / world_size)``."""
    _check(n, 1, world_size, rank)
    sampler = DistributedSampler(range(n), num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=False)
    sampler.set_epoch(epoch)
    return list(sampler)


def steps_per_epoch(n: int, micro_batch: int, world_size: int = 1) -> int:
    """Micro-batches per process per epoch: ``ceil(ceil(n / world_size) / micro_batch)``."""
    _check(n, micro_batch, world_size, 0)
    return math.ceil(math.ceil(n / world_size) / micro_batch)


def distributed_indices(n: int, micro_batch: int, world_size: int, rank: int, seed: int, epoch: int) -> list[list[int]]:
    """The micro-batches (lists of example indices) of process ``rank`` in ``epoch``.

    Args:
        n: training examples.
        micro_batch: examples per forward/backward pass, per process.
        world_size: number of processes; rank: this process, ``0 <= rank < world_size``.
        seed: the run's ``training.seed``; epoch: 0-based epoch.

    Returns:
        ``steps_per_epoch(n, micro_batch, world_size)`` lists; the last one may be short.

    Raises:
        ValueError: ``n < 1``, ``micro_batch < 1`` or a rank outside ``[0, world_size)``.
    """
    _check(n, micro_batch, world_size, rank)
    order = epoch_order(n, world_size=world_size, rank=rank, seed=seed, epoch=epoch)
    return [order[i : i + micro_batch] for i in range(0, len(order), micro_batch)]


def micro_batch_at(n: int, micro_batch: int, seed: int, index: int, *, world_size: int = 1, rank: int = 0) -> list[int]:
    """Example indices of this process's global micro-batch number ``index`` (0-based, counted
    across epochs): the data position a checkpoint's global step maps to."""
    epoch, k = divmod(index, steps_per_epoch(n, micro_batch, world_size))
    order = epoch_order(n, world_size=world_size, rank=rank, seed=seed, epoch=epoch)
    return order[k * micro_batch : (k + 1) * micro_batch]
