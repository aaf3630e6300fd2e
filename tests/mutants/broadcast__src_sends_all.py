"""src sends the tensor to every other rank in turn (the first broadcast everyone writes):
the right result, but src sends p - 1 copies while the others wait, instead of a tree's
ceil(log2 p)."""
import torch.distributed as dist

CAUGHT_BY = "bytes sent per rank for n = 10000 float32 numbers from src = 0"
HINT = "a tree: every rank that has the tensor sends it"


def broadcast(tensor, src):
    rank, size = dist.get_rank(), dist.get_world_size()
    if rank == src:
        for dst in range(size):
            if dst != src:
                dist.send(tensor, dst)
    else:
        dist.recv(tensor, src)
