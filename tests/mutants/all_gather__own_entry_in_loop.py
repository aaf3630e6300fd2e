"""Copies its own tensor into tensor_list[rank] inside the loop, at step 0: with one rank
there are no steps, so the own entry is never written. Entry r is rank r's tensor at every
world size, p = 1 included."""
import torch.distributed as dist
from dist_sgd.comm.collectives import _check_list, _check_tensor
from dist_sgd.plumbing.rank import world

CAUGHT_BY = "n = 7 float32 numbers per rank"
HINT = "entry r on rank r is your own tensor: copy it"


def all_gather(tensor_list, tensor):
    _check_tensor(tensor, "tensor")
    rank, size = world("all_gather")
    _check_list(tensor_list, "tensor_list", tensor, size)
    right, left = (rank + 1) % size, (rank - 1) % size
    for s in range(size - 1):
        if s == 0:
            tensor_list[rank].copy_(tensor)
        give, take = (rank - s) % size, (rank - s - 1) % size
        req = dist.irecv(tensor_list[take], left)
        dist.send(tensor_list[give], right)
        req.wait()
