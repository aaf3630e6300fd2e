"""The all-gather adds the arriving chunk as the reduce-scatter did, instead of copying it."""
import torch
import torch.distributed as dist

CAUGHT_BY = "n = 10007 float32 numbers (p does not divide n)"


def ring_all_reduce(x):
    r, p = dist.get_rank(), dist.get_world_size()
    chunks = x.tensor_split(p)
    inbox = torch.empty_like(chunks[0])
    for lag in (1, 0):
        for s in range(p - 1):
            give = (r - s - lag) % p
            take = (give - 1) % p
            incoming = inbox[:chunks[take].numel()]
            req = dist.irecv(incoming, (r - 1) % p)
            dist.send(chunks[give], (r + 1) % p)
            req.wait()
            chunks[take].add_(incoming)
