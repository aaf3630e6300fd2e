"""Pads by repeating the order's start once, order + order[:padding]: when the padding is
longer than the dataset (n = 1 item on 3 or 4 ranks: 2 or 3 to pad) the order stays too
short and some ranks get no index. DistributedSampler repeats the order as often as needed."""
import math
import torch
import torch.distributed as dist
from torch.utils.data import Sampler
from dist_sgd.sgd.partition import _group_default


CAUGHT_BY = "padding: n = 11 and n smaller than the world size"
HINT = "without drop_last pad the order up to"


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
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = torch.randperm(n, generator=g).tolist()
        else:
            order = list(range(n))
        if self.drop_last:
            return order[:self.total_size]
        padding = self.total_size - n
        return order + order[:padding]

    def __iter__(self):
        return iter(self.indices()[self.rank:self.total_size:self.num_replicas])

    def __len__(self):
        return self.num_samples
