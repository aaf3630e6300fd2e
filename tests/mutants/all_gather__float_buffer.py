"""Receives into torch.empty(tensor.shape), float32 whatever the tensor's dtype, then copies
into the entry: an int64 tensor's message (8 bytes a number) does not fit a float32 buffer,
and integers above 2^24 would lose digits. Receive straight into the entry."""
import torch
import torch.distributed as dist
from dist_sgd.comm.collectives import _check_list, _check_tensor
from dist_sgd.plumbing.rank import world

CAUGHT_BY = "a 2 x 3 int64 tensor per rank (entries keep shape and dtype)"
HINT = "disagree on a message's size"


def all_gather(tensor_list, tensor):
    _check_tensor(tensor, "tensor")
    rank, size = world("all_gather")
    _check_list(tensor_list, "tensor_list", tensor, size)
    right, left = (rank + 1) % size, (rank - 1) % size
    tensor_list[rank].copy_(tensor)
    for s in range(size - 1):
        give, take = (rank - s) % size, (rank - s - 1) % size
        inbox = torch.empty(tensor.shape)
        req = dist.irecv(inbox, left)
        dist.send(tensor_list[give], right)
        req.wait()
        tensor_list[take].copy_(inbox)
