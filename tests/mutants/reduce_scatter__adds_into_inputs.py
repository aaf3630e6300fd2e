"""Adds the arriving partial sums into the caller's input_list itself: the output is right,
but the inputs come back changed (torch leaves them alone)."""
import torch
import torch.distributed as dist

CAUGHT_BY = "entries of n = 5 float64 numbers"
HINT = "torch leaves input_list as it was: add into"


def reduce_scatter(output, input_list):
    rank, size = dist.get_rank(), dist.get_world_size()
    inbox = torch.empty_like(output)
    for step in range(size - 1):
        give, take = (rank - step - 1) % size, (rank - step - 2) % size
        req = dist.irecv(inbox, (rank - 1) % size)
        dist.send(input_list[give], (rank + 1) % size)
        req.wait()
        input_list[take] += inbox
    output.copy_(input_list[rank])
