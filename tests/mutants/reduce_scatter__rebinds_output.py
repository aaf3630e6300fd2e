"""Ends with `output = partial[rank]`: that rebinds the local name, and the caller's output
tensor is never written. The result must go into output in place (output.copy_(...))."""
import torch
import torch.distributed as dist
from dist_sgd.comm.collectives import _check_list, _check_tensor
from dist_sgd.plumbing.rank import world

CAUGHT_BY = "entries of n = 5 float64 numbers"
HINT = "at step s send entry (r - s - 1) % p and add"


def reduce_scatter(output, input_list):
    _check_tensor(output, "output")
    rank, size = world("reduce_scatter")
    _check_list(input_list, "input_list", output, size)
    right, left = (rank + 1) % size, (rank - 1) % size
    partial = [t.clone() for t in input_list]
    for s in range(size - 1):
        give, take = (rank - s - 1) % size, (rank - s - 2) % size
        inbox = torch.empty_like(output)
        req = dist.irecv(inbox, left)
        dist.send(partial[give], right)
        req.wait()
        partial[take] += inbox
    output = partial[rank]
    return output
