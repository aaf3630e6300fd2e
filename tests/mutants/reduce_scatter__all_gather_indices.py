"""Uses the all-gather's indices (send entry r - s, add into r - s - 1): the entry completed
at the end is rank r + 1's, so output holds only part of the sum of entry r."""
import torch
import torch.distributed as dist

CAUGHT_BY = "entries of n = 5 float64 numbers"
HINT = ("at step s send entry (r - s - 1) % p and add",
        "this rank still holds its own values")


def reduce_scatter(output, input_list):
    rank, size = dist.get_rank(), dist.get_world_size()
    partial = [t.clone() for t in input_list]
    inbox = torch.empty_like(output)
    for step in range(size - 1):
        give, take = (rank - step) % size, (rank - step - 1) % size
        req = dist.irecv(inbox, (rank - 1) % size)
        dist.send(partial[give], (rank + 1) % size)
        req.wait()
        partial[take] += inbox
    output.copy_(partial[rank])
