"""ShardSampler against torch's DistributedSampler, index for index; DataPartitioner; the
detector for the old example's never-passed sampler. Pure Python: no processes."""
import itertools

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from dist_sgd.sgd.partition import (DataPartitioner, ShardSampler, check_sharded, is_sharded,
                                loader_indices, shard_report)


class Sized:
    """A dataset of length n: the samplers only ever call len()."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


LENGTHS = list(range(0, 23)) + [31, 64, 97, 100, 1000, 1001]


def test_shard_sampler_equals_distributed_sampler():
    cases = 0
    for n, replicas, shuffle, drop_last in itertools.product(
            LENGTHS, (1, 2, 3, 4, 5, 8), (True, False), (True, False)):
        data = Sized(n)
        for rank in range(replicas):
            for seed in ((0, 7) if shuffle else (0,)):
                ours = ShardSampler(data, replicas, rank, shuffle=shuffle, seed=seed,
                                    drop_last=drop_last)
                theirs = DistributedSampler(data, replicas, rank, shuffle=shuffle, seed=seed,
                                            drop_last=drop_last)
                assert len(ours) == len(theirs), (n, replicas, rank, drop_last)
                for epoch in (0, 1, 5):
                    ours.set_epoch(epoch)
                    theirs.set_epoch(epoch)
                    assert list(ours) == list(theirs), (n, replicas, rank, shuffle, seed,
                                                        drop_last, epoch)
                    cases += 1
    assert cases > 3000


def test_shards_partition_the_padded_order():
    # Together the shards are the padded (or cut) global order: disjoint up to the padding.
    for n, replicas in [(10, 4), (12, 4), (3, 5), (1000, 3)]:
        for drop_last in (False, True):
            shards = [list(ShardSampler(Sized(n), replicas, r, drop_last=drop_last))
                      for r in range(replicas)]
            report = shard_report(shards, n)
            sizes = {len(s) for s in shards}
            assert len(sizes) == 1, "every rank must get the same number of items"
            if drop_last:
                assert report["pairwise_disjoint"] and report["missing"] == n % replicas
            else:
                assert report["missing"] == 0
                assert report["repeats"] == (-n % replicas if n >= replicas else replicas - n)


def test_epochs_reshuffle_and_seed_matters():
    data = Sized(50)
    s = ShardSampler(data, 2, 0, seed=3)
    first = list(s)
    s.set_epoch(1)
    assert list(s) != first
    s.set_epoch(0)
    assert list(s) == first  # deterministic: same seed + epoch, same order
    assert list(ShardSampler(data, 2, 0, seed=4)) != first


def test_shard_sampler_errors():
    data = Sized(10)
    with pytest.raises(ValueError, match="Invalid rank 2"):
        ShardSampler(data, 2, 2)
    with pytest.raises(ValueError, match="Invalid rank -1"):
        ShardSampler(data, 2, -1)
    with pytest.raises(ValueError, match="at least 1"):
        ShardSampler(data, 0, 0)
    with pytest.raises(TypeError, match="must be an int"):
        ShardSampler(data, 2.0, 0)
    with pytest.raises(RuntimeError, match="no process group"):
        ShardSampler(data)  # no group here: must say what to do instead of a bare error


def test_data_partitioner_covers_the_data_once():
    data = list(range(103))
    for sizes in ([0.5, 0.5], [1 / 3] * 3, [0.7, 0.2, 0.1], [1.0]):
        parts = DataPartitioner(data, sizes, seed=5)
        items = [[parts.use(i)[j] for j in range(len(parts.use(i)))] for i in range(len(sizes))]
        assert sorted(x for part in items for x in part) == data  # nothing lost, nothing twice
        for part, frac in zip(items, sizes):
            assert abs(len(part) - frac * len(data)) <= 1
        again = DataPartitioner(data, sizes, seed=5)
        assert again.partitions == parts.partitions  # same seed, same parts
    assert DataPartitioner(data, [0.5, 0.5], seed=1).use(0).index != DataPartitioner(
        data, [0.5, 0.5], seed=2).use(0).index
    with pytest.raises(ValueError, match="sum to 1"):
        DataPartitioner(data, [0.5, 0.6])
    with pytest.raises(ValueError, match="partition must be"):
        DataPartitioner(data, [0.5, 0.5]).use(2)


def test_detects_a_sampler_that_was_never_passed():
    dataset = TensorDataset(torch.arange(40.0))
    sampler = DistributedSampler(dataset, 4, 1)
    buggy = DataLoader(dataset, batch_size=5, shuffle=True)  # the old example: sampler unused
    fixed = DataLoader(dataset, batch_size=5, sampler=sampler)
    ours = DataLoader(dataset, batch_size=5, sampler=ShardSampler(dataset, 4, 1))
    assert not is_sharded(buggy) and is_sharded(fixed) and is_sharded(ours)
    with pytest.raises(ValueError, match="4x the work"):
        check_sharded(buggy, world_size=4)
    check_sharded(buggy, world_size=1)  # one process: the whole dataset is right
    check_sharded(fixed, world_size=4)
    assert sorted(loader_indices(buggy)) == list(range(40))  # the whole dataset on this rank
    assert loader_indices(fixed) == list(sampler)
    assert len(loader_indices(ours)) == 10
