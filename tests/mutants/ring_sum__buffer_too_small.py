"""A receive buffer one element shorter than what the neighbour sends (a size computed from
the wrong tensor): gloo aborts the receiving process, which dies without a Python error."""
import torch
import torch.distributed as dist

CAUGHT_BY = "a 3 x 5 float32 tensor: the sum against dist.all_reduce"
HINT = "disagree on a message's size"


def ring_sum(tensor):
    rank, size = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % size, (rank - 1) % size
    total, travelling = tensor.clone(), tensor.reshape(-1)
    for _ in range(size - 1):
        arrived = torch.zeros(travelling.numel() - 1, dtype=travelling.dtype)
        if rank % 2 == 0:
            dist.send(travelling, right)
            dist.recv(arrived, left)
        else:
            dist.recv(arrived, left)
            dist.send(travelling, right)
        arrived = torch.cat([arrived, arrived[:1]])
        total += arrived.reshape(total.shape)
        travelling = arrived
    return total
