"""Uses torch's own all_reduce inside: right numbers, but not a ring built from isend/irecv."""
import torch.distributed as dist

CAUGHT_BY = "n = 10007 float32 numbers (p does not divide n)"
HINT = "build it from isend/irecv (or send/recv) only:"


def ring_all_reduce(x):
    dist.all_reduce(x)
