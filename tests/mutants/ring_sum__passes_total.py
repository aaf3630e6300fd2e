"""Passes its running total on instead of what arrived: from three ranks on, a neighbour's
tensor is counted again at every step (right at p = 2, where there is one step)."""
import torch
import torch.distributed as dist

CAUGHT_BY = "a 3 x 5 float32 tensor: the sum against dist.all_reduce"
HINT = "pass on exactly what arrived, in a buffer of"


def ring_sum(tensor):
    rank, size = dist.get_rank(), dist.get_world_size()
    total = tensor.clone()
    for _ in range(size - 1):
        arrived = torch.empty_like(total)
        if rank % 2 == 0:
            dist.send(total, (rank + 1) % size)
            dist.recv(arrived, (rank - 1) % size)
        else:
            dist.recv(arrived, (rank - 1) % size)
            dist.send(total, (rank + 1) % size)
        total = total + arrived
    return total
