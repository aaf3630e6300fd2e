"""Receives into torch.empty(tensor.shape), a float32 buffer, and copies it into the tensor:
an int64 tensor's message (8 bytes a number) does not fit, and integers above 2^24 would lose
digits on the way. Receive straight into `tensor` (any dtype): it is the result."""
import torch
import torch.distributed as dist
from dist_sgd.comm.collectives import _check_rank, _check_tensor
from dist_sgd.plumbing.rank import world

CAUGHT_BY = "a 3 x 5 int64 tensor from src = 1 (src = 0 at p = 1)"
HINT = "disagree on a message's size"


def broadcast(tensor, src):
    _check_tensor(tensor, "tensor")
    rank, size = world("broadcast")
    _check_rank(src, "src", size)
    me = (rank - src) % size
    have = 1
    while have < size:
        if me < have and me + have < size:
            dist.send(tensor, (rank + have) % size)
        elif have <= me < 2 * have:
            buffer = torch.empty(tensor.shape)
            dist.recv(buffer, (rank - have) % size)
            tensor.copy_(buffer)
        have *= 2
