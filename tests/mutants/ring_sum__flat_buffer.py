"""Receives into a flat buffer of as many numbers (messages as flat arrays of bytes): the
message fits, but the arrived values, shaped (15,), do not add to a (3, 5) total. The buffer
must be shaped like the tensor the left neighbour sends (torch.empty_like)."""
import torch
import torch.distributed as dist

CAUGHT_BY = "a 3 x 5 float32 tensor: the sum against dist.all_reduce"
HINT = "receive into a buffer the size of the tensor your left neighbour sends, and of its shape"


def ring_sum(tensor):
    rank, size = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % size, (rank - 1) % size
    total, travelling = tensor.clone(), tensor
    for _ in range(size - 1):
        arrived = torch.empty(travelling.numel(), dtype=travelling.dtype)
        if rank % 2 == 0:
            dist.send(travelling, right)
            dist.recv(arrived, left)
        else:
            dist.recv(arrived, left)
            dist.send(travelling, right)
        total += arrived
        travelling = arrived
    return total
