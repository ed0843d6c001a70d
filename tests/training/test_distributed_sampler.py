"""docs/CASES.md C10: 16,000 examples, per-process micro-batch 8, 2 processes -> 1,000 steps per process per
epoch (not 2,000); the two index sets are disjoint and cover all 16,000; the order changes
between epochs; and the single-process training order is the same rule with world_size 1."""

from __future__ import annotations

import pytest

from tuneproof.training.budget import micro_batches_per_epoch
from tuneproof.training.data_order import distributed_indices, epoch_order, micro_batch_at
from tuneproof.training.loop import micro_batch_indices


def test_c10_two_processes_split_an_epoch():
    n, mb, world = 16_000, 8, 2
    assert micro_batches_per_epoch(n, mb, world) == 1_000 and micro_batches_per_epoch(n, mb, 1) == 2_000
    ranks = [distributed_indices(n, mb, world, rank, seed=0, epoch=0) for rank in range(world)]
    for batches in ranks:
        assert len(batches) == 1_000 and all(len(b) == mb for b in batches)
    sets = [{i for b in batches for i in b} for batches in ranks]
    assert all(len(s) == 8_000 for s in sets)  # no repeat inside a process
    assert sets[0].isdisjoint(sets[1])
    assert sets[0] | sets[1] == set(range(n))


def test_c10_order_changes_between_epochs_and_is_reproducible():
    e0 = distributed_indices(16_000, 8, 2, 0, seed=0, epoch=0)
    e1 = distributed_indices(16_000, 8, 2, 0, seed=0, epoch=1)
    assert e0 != e1 and e0 == distributed_indices(16_000, 8, 2, 0, seed=0, epoch=0)
    assert distributed_indices(16_000, 8, 2, 0, seed=1, epoch=0) != e0


def test_uneven_n_pads_like_distributed_sampler():
    shares = [epoch_order(10, world_size=3, rank=r, seed=0, epoch=0) for r in range(3)]
    assert [len(s) for s in shares] == [4, 4, 4]  # ceil(10 / 3), 2 indices repeated to even the shares
    assert set().union(*map(set, shares)) == set(range(10))
    with pytest.raises(ValueError, match="rank 2 is not in"):
        distributed_indices(10, 2, 2, 2, 0, 0)


def test_training_order_is_the_world_size_1_rule_across_epochs():
    n, mb = 10, 4  # 3 micro-batches per epoch, the last one short
    flat = [micro_batch_indices(n, mb, 7, i) for i in range(6)]
    assert flat[:3] == distributed_indices(n, mb, 1, 0, 7, 0) and flat[3:] == distributed_indices(n, mb, 1, 0, 7, 1)
    assert [len(b) for b in flat] == [4, 4, 2, 4, 4, 2]
    assert sorted(i for b in flat[:3] for i in b) == list(range(n)) and flat[:3] != flat[3:]
    assert micro_batch_at(16_000, 8, 0, 1_000, world_size=2, rank=1) == distributed_indices(16_000, 8, 2, 1, 0, 1)[0]
