"""Sends its own tensor at every step instead of passing on what it got last: each rank then
receives its left neighbour's tensor p - 1 times and files it under entries (r - s - 1) % p,
so from p = 3 on the entries two or more places to the left hold the wrong rank's tensor."""
import torch.distributed as dist
from dist_sgd.comm.collectives import _check_list, _check_tensor
from dist_sgd.plumbing.rank import world

CAUGHT_BY = "n = 7 float32 numbers per rank"
HINT = "at step s the tensor arriving from the left is"


def all_gather(tensor_list, tensor):
    _check_tensor(tensor, "tensor")
    rank, size = world("all_gather")
    _check_list(tensor_list, "tensor_list", tensor, size)
    right, left = (rank + 1) % size, (rank - 1) % size
    tensor_list[rank].copy_(tensor)
    for s in range(size - 1):
        take = (rank - s - 1) % size
        req = dist.irecv(tensor_list[take], left)
        dist.send(tensor_list[rank], right)
        req.wait()
