"""Computes the total and never returns it: the sum is there, in a local variable, and the
caller gets None. ring_sum returns the sum, a new tensor; the caller's tensor is left as it
was (unlike torch's in-place all_reduce)."""
import torch
import torch.distributed as dist

CAUGHT_BY = "a 3 x 5 float32 tensor: the sum against dist.all_reduce"
HINT = "return the total: a new tensor holding the sum"


def ring_sum(tensor):
    rank, size = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % size, (rank - 1) % size
    total, travelling = tensor.clone(), tensor
    for _ in range(size - 1):
        arrived = torch.empty_like(tensor)
        if rank % 2 == 0:
            dist.send(travelling, right)
            dist.recv(arrived, left)
        else:
            dist.recv(arrived, left)
            dist.send(travelling, right)
        total += arrived
        travelling = arrived
