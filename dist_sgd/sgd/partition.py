"""Give every rank its own part of the data: the tutorial's DataPartitioner, then a sampler.

    part = DataPartitioner(dataset, [0.5, 0.5]).use(rank)      # the tutorial's idea
    sampler = ShardSampler(dataset)                             # = DistributedSampler
    loader = DataLoader(dataset, batch_size=b, sampler=sampler) # pass it, or it does nothing!
    for epoch in range(epochs):
        sampler.set_epoch(epoch)                                # a new shuffle every epoch
        ...

ShardSampler yields, index for index, what torch.utils.data.distributed.DistributedSampler
yields with the same arguments (tests/test_partition.py checks thousands of cases). The
recipe: one permutation of all indices, the same on every rank (seeded with seed + epoch);
pad it by repeating its first indices until it splits evenly (or cut the tail with
drop_last); rank r takes every num_replicas-th index starting at r.
"""
import math
import random

import torch
import torch.distributed as dist
from torch.utils.data import Dataset, Sampler
from torch.utils.data.distributed import DistributedSampler

from dist_sgd.plumbing.mine import swap_in
from dist_sgd.plumbing.rank import world


class Partition(Dataset):
    """A view of `data` through a list of indices (the tutorial's Partition)."""

    def __init__(self, data, index):
        self.dataset, self.index = data, list(index)

    def __len__(self):
        return len(self.index)

    def __getitem__(self, i):
        return self.dataset[self.index[i]]


class DataPartitioner:
    """Shuffle the indices once (seeded, so every rank gets the same shuffle), then cut them
    into consecutive parts whose sizes are the given fractions; use(r) is rank r's part.

    Unlike the tutorial's int(frac * len) per part, the cut points are rounded cumulative
    sums, so no item is lost to rounding: the parts always cover the data exactly once.
    """

    def __init__(self, data, sizes=(0.7, 0.2, 0.1), seed=1234):
        sizes = [float(s) for s in sizes]
        if not sizes or min(sizes) < 0 or not math.isclose(sum(sizes), 1.0, abs_tol=1e-6):
            raise ValueError(f"sizes must be non-negative fractions that sum to 1, got {sizes}")
        self.dataset = data  # (named dataset: tensor .data is a different, banned thing)
        indexes = list(range(len(data)))
        random.Random(seed).shuffle(indexes)  # same seed on every rank -> same shuffle
        cuts, total = [0], 0.0
        for frac in sizes:
            total += frac
            cuts.append(round(min(total, 1.0) * len(indexes)))
        cuts[-1] = len(indexes)
        self.partitions = [indexes[a:b] for a, b in zip(cuts, cuts[1:])]

    def use(self, partition):
        if not 0 <= partition < len(self.partitions):
            raise ValueError(f"partition must be in [0, {len(self.partitions) - 1}], "
                             f"got {partition}")
        return Partition(self.dataset, self.partitions[partition])


def _group_default(value, what, getter):
    """value if given, else getter() from the process group (a clear error without one)."""
    if value is not None:
        return value
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(f"ShardSampler: {what} not given and no process group is initialized; "
                           f"pass {what}=... or create it inside dist_sgd.plumbing.launch / "
                           "torchrun")
    return getter()


class ShardSampler(Sampler):
    """This rank's share of the dataset's indices; DistributedSampler's behaviour, written out.

    num_replicas and rank default to the process group's world size and rank. Every rank
    must use the same seed (and call set_epoch with the same epoch), or the shards overlap.
    """

    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True, seed=0,
                 drop_last=False):
        num_replicas = _group_default(num_replicas, "num_replicas", dist.get_world_size)
        rank = _group_default(rank, "rank", dist.get_rank)
        for name, value in (("num_replicas", num_replicas), ("rank", rank)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {value!r}")
        if num_replicas < 1:
            raise ValueError(f"num_replicas must be at least 1, got {num_replicas}")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"Invalid rank {rank}, rank should be in the interval "
                             f"[0, {num_replicas - 1}] for num_replicas={num_replicas}")
        self.dataset, self.num_replicas, self.rank = dataset, num_replicas, rank
        self.shuffle, self.seed, self.drop_last, self.epoch = shuffle, seed, drop_last, 0
        # ---- exercise ShardSampler: self.num_samples (indices per rank) and self.total_size
        n = len(dataset)
        if drop_last:
            # Cut the tail to the largest multiple of num_replicas: up to num_replicas - 1
            # items are not seen this epoch (a different few each epoch when shuffling).
            self.num_samples = n // num_replicas
        else:
            # Round up: the last shard is topped up with repeated indices so that every rank
            # runs the same number of steps (a rank with fewer steps would leave its peers
            # waiting forever in an all-reduce).
            self.num_samples = math.ceil(n / num_replicas)
        self.total_size = self.num_samples * num_replicas
        # ---- end of exercise

    def set_epoch(self, epoch):
        """Call at the start of every epoch, with the same value on all ranks."""
        self.epoch = epoch

    def indices(self):
        """The global order of this epoch, padded or cut to total_size (before the split)."""
        # ---- exercise ShardSampler: this epoch's order of all indices, padded or cut to total_size
        n = len(self.dataset)
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)  # all ranks draw the same permutation
            order = torch.randperm(n, generator=g).tolist()
        else:
            order = list(range(n))
        if self.drop_last:
            return order[:self.total_size]
        padding = self.total_size - n
        while padding > 0 and order:  # repeat from the front (several times if n < num_replicas)
            extra = order[:padding]
            order, padding = order + extra, padding - len(extra)
        return order
        # ---- end of exercise

    def __iter__(self):
        # ---- exercise ShardSampler: an iterator over this rank's share of self.indices()
        # Strided, not contiguous: rank r takes positions r, r + R, r + 2R, ... so a global
        # batch of B consecutive positions is shared out evenly as B / R per rank.
        return iter(self.indices()[self.rank:self.total_size:self.num_replicas])
        # ---- end of exercise

    def __len__(self):
        return self.num_samples


SHARDING_SAMPLERS = (ShardSampler, DistributedSampler)


def loader_sampler(loader):
    """The sampler that decides which indices a DataLoader visits (under its batch sampler)."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    return getattr(batch_sampler, "sampler", None) or loader.sampler


def is_sharded(loader):
    """True when the DataLoader draws from a distributed sampler (ours or torch's)."""
    return isinstance(loader_sampler(loader), SHARDING_SAMPLERS)


def check_sharded(loader, world_size=None):
    """Raise if, with several ranks, the loader would give every rank the whole dataset.

    The old gloo MNIST example built a DistributedSampler and then passed shuffle=True to
    its DataLoader instead of sampler=...: nothing fails, every rank just trains on all of
    the data, world_size times the work per epoch. This catches that.
    """
    if world_size is None:
        _, world_size = world()
    if world_size > 1 and not is_sharded(loader):
        kind = type(loader_sampler(loader)).__name__
        raise ValueError(
            f"the DataLoader samples with a {kind}, so each of the {world_size} ranks visits the "
            f"whole dataset ({len(loader.dataset)} items) every epoch: {world_size}x the work. "
            "Pass sampler=ShardSampler(dataset) (or DistributedSampler) to the DataLoader, "
            "and no shuffle=True")


def loader_indices(loader):
    """The dataset indices one pass over the loader visits, in order, without loading data."""
    if loader.batch_sampler is not None:
        return [i for batch in loader.batch_sampler for i in batch]
    return list(loader.sampler)


def shard_report(shards, n):
    """Count how index lists (one per rank) cover range(n): visits, unique, repeats, missing."""
    visits = sum(len(s) for s in shards)
    seen = set().union(*map(set, shards)) if shards else set()
    return {"visits": visits, "unique": len(seen), "repeats": visits - len(seen),
            "missing": n - len(seen & set(range(n))), "pairwise_disjoint": visits == len(seen)}


# DIST_SGD_MINE: a learner's version replaces ours
swap_in(globals(), "ShardSampler", ("ShardSampler",), lesson="05")
