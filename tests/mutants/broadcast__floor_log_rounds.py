"""Counts the rounds as int(log2(p)), rounded down: at p = 3 one round, so only rank src + 1
gets the tensor and the third rank keeps its own. A binomial tree needs ceil(log2 p) rounds
when p is not a power of two."""
import math

import torch.distributed as dist
from dist_sgd.comm.collectives import _check_rank, _check_tensor
from dist_sgd.plumbing.rank import world

CAUGHT_BY = "n = 1001 float32 numbers from src = p - 1"
HINT = "this rank still holds its own values"


def broadcast(tensor, src):
    _check_tensor(tensor, "tensor")
    rank, size = world("broadcast")
    _check_rank(src, "src", size)
    me = (rank - src) % size
    rounds = int(math.log2(size)) if size > 1 else 0
    for k in range(rounds):
        step = 1 << k
        if me < step and me + step < size:
            dist.send(tensor, (rank + step) % size)
        elif step <= me < 2 * step:
            dist.recv(tensor, (rank - step) % size)
