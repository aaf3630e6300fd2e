"""Goes round the ring p times instead of p - 1: the last step brings this rank's own tensor
back and adds it a second time, so the total counts every rank once and this rank twice."""
import torch
import torch.distributed as dist

CAUGHT_BY = "a 3 x 5 float32 tensor: the sum against dist.all_reduce"
HINT = "pass on exactly what arrived, in a buffer of"


def ring_sum(tensor):
    rank, size = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % size, (rank - 1) % size
    total, travelling = tensor.clone(), tensor.clone()
    if size == 1:
        return total
    for _ in range(size):
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
