"""Cuts x into cloned chunks ([c.clone() for c in x.tensor_split(p)]) and sums those: the
ring is right, but the chunks are copies, so x itself never changes. The sum must land in
x, in place: tensor_split's views write through to it."""
import torch
import torch.distributed as dist

CAUGHT_BY = "n = 10007 float32 numbers (p does not divide n)"
HINT = "this rank still holds its own values"


def ring_all_reduce(x):
    r, p = dist.get_rank(), dist.get_world_size()
    right, left = (r + 1) % p, (r - 1) % p
    chunks = [c.clone() for c in x.tensor_split(p)]
    for s in range(p - 1):
        give, take = (r - s - 1) % p, (r - s - 2) % p
        inbox = torch.empty_like(chunks[take])
        req = dist.irecv(inbox, left)
        dist.send(chunks[give], right)
        req.wait()
        chunks[take] += inbox
    for s in range(p - 1):
        give, take = (r - s) % p, (r - s - 1) % p
        inbox = torch.empty_like(chunks[take])
        req = dist.irecv(inbox, left)
        dist.send(chunks[give], right)
        req.wait()
        chunks[take].copy_(inbox)
    return torch.cat(chunks)
