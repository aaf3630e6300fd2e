"""Receives each entry into a flat buffer of as many numbers, torch.empty(output.numel()):
the message fits, but a (6,) inbox does not add into a (2, 3) entry. Each message is one entry
of the list: the inbox is shaped like output."""
import torch
import torch.distributed as dist
from dist_sgd.comm.collectives import _check_list, _check_tensor
from dist_sgd.plumbing.rank import world

CAUGHT_BY = "2 x 3 int64 entries (exact sums, shape and dtype kept)"
HINT = "each message is one entry of the list: receive into a buffer shaped like output"


def reduce_scatter(output, input_list):
    _check_tensor(output, "output")
    rank, size = world("reduce_scatter")
    _check_list(input_list, "input_list", output, size)
    right, left = (rank + 1) % size, (rank - 1) % size
    sums = [t.clone() for t in input_list]
    inbox = torch.empty(output.numel(), dtype=output.dtype)
    for step in range(size - 1):
        give, take = (rank - step - 1) % size, (rank - step - 2) % size
        recv = dist.irecv(inbox, left)
        dist.isend(sums[give], right).wait()
        recv.wait()
        sums[take] += inbox
    output.copy_(sums[rank])
