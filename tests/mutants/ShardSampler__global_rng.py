"""Draws the order from torch's global generator (torch.manual_seed(seed + epoch), then
torch.randperm(n)): the indices are DistributedSampler's, but every epoch reseeds the whole
process's random numbers, so the model's dropout and initialisation repeat each epoch.
DistributedSampler uses a generator of its own and leaves the global one alone."""
import math
import torch
import torch.distributed as dist
from torch.utils.data import Sampler
from dist_sgd.sgd.partition import _group_default


CAUGHT_BY = "shuffled, seeds 0 and 7, n = 100 and 101, epoch 0"
HINT = "draw from a generator of your own"


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
        n = len(self.dataset)
        if drop_last:
            self.num_samples = n // num_replicas
        else:
            self.num_samples = math.ceil(n / num_replicas)
        self.total_size = self.num_samples * num_replicas

    def set_epoch(self, epoch):
        self.epoch = epoch

    def indices(self):
        n = len(self.dataset)
        if self.shuffle:
            torch.manual_seed(self.seed + self.epoch)
            order = torch.randperm(n).tolist()
        else:
            order = list(range(n))
        if self.drop_last:
            return order[:self.total_size]
        while len(order) < self.total_size:
            order += order[:self.total_size - len(order)]
        return order

    def __iter__(self):
        return iter(self.indices()[self.rank:self.total_size:self.num_replicas])

    def __len__(self):
        return self.num_samples
