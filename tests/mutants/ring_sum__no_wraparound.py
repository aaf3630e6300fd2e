"""The neighbours as rank + 1 and rank - 1, without % p: rank 0's left neighbour is -1 and
the last rank's right one is p, ranks that do not exist. The ring wraps around: rank 0
receives from rank p - 1, and rank p - 1 sends to rank 0."""
import torch
import torch.distributed as dist

CAUGHT_BY = "a 3 x 5 float32 tensor: the sum against dist.all_reduce"


def ring_sum(tensor):
    rank, size = dist.get_rank(), dist.get_world_size()
    right, left = rank + 1, rank - 1
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
    return total
