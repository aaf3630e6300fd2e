"""Calls torch's all_reduce: the right sum, but no ring of send/recv."""
import torch.distributed as dist

CAUGHT_BY = "a 3 x 5 float32 tensor: the sum against dist.all_reduce"
HINT = "build it from isend/irecv (or send/recv) only:"


def ring_sum(tensor):
    total = tensor.clone()
    dist.all_reduce(total)
    return total
