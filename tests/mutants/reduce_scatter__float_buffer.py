"""Receives into torch.zeros(output.shape), float32 whatever the dtype: an int64 entry's
message (8 bytes a number) does not fit it, and adding a float32 buffer into an int64 entry
is refused. The sums must be exact, in the entries' own dtype."""
import torch
import torch.distributed as dist
from dist_sgd.comm.collectives import _check_list, _check_tensor
from dist_sgd.plumbing.rank import world

CAUGHT_BY = "2 x 3 int64 entries (exact sums, shape and dtype kept)"
HINT = "disagree on a message's size"


def reduce_scatter(output, input_list):
    _check_tensor(output, "output")
    rank, size = world("reduce_scatter")
    _check_list(input_list, "input_list", output, size)
    right, left = (rank + 1) % size, (rank - 1) % size
    partial = [t.clone() for t in input_list]
    for s in range(size - 1):
        give, take = (rank - s - 1) % size, (rank - s - 2) % size
        inbox = torch.zeros(output.shape)
        req = dist.irecv(inbox, left)
        dist.send(partial[give], right)
        req.wait()
        partial[take] += inbox
    output.copy_(partial[rank])
