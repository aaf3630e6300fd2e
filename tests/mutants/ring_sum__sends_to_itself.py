"""The neighbours' arithmetic slips: (rank + 1) % size written rank % size, so each rank sends
to itself, which gloo refuses ("Pair is not connected"), a raw error without this file's hint."""
import torch
import torch.distributed as dist

CAUGHT_BY = "a 3 x 5 float32 tensor: the sum against dist.all_reduce"
HINT = "a rank sent to (or received from) itself"


def ring_sum(tensor):
    rank, size = dist.get_rank(), dist.get_world_size()
    right, left = rank % size, (rank - 1) % size
    total, travelling = tensor.clone(), tensor
    for _ in range(size - 1):
        arrived = torch.empty_like(travelling)
        if rank % 2 == 0:
            dist.send(travelling, right)
            dist.recv(arrived, left)
        else:
            dist.recv(arrived, left)
            dist.send(travelling, right)
        total += arrived
        travelling = arrived
    return total
