"""Forgets to put its own tensor into tensor_list[rank] first: what it passes on at step 0,
and keeps, is whatever that entry held before."""
import torch.distributed as dist

CAUGHT_BY = "n = 7 float32 numbers per rank"
HINT = "entry r on rank r is your own tensor: copy it"


def all_gather(tensor_list, tensor):
    rank, size = dist.get_rank(), dist.get_world_size()
    for step in range(size - 1):
        give, take = (rank - step) % size, (rank - step - 1) % size
        req = dist.irecv(tensor_list[take], (rank - 1) % size)
        dist.send(tensor_list[give], (rank + 1) % size)
        req.wait()
