"""Receives each chunk into torch.empty(chunk.shape), float32 whatever x's dtype: an int64
chunk's message (8 bytes a number) does not fit, and integer sums must stay exact in x's own
dtype. The inbox takes the chunk's dtype: torch.empty_like(chunk)."""
import torch
import torch.distributed as dist

CAUGHT_BY = "n = 1001 int64 numbers (the chunks keep x's dtype)"
HINT = "disagree on a message's size"


def ring_all_reduce(x):
    r, p = dist.get_rank(), dist.get_world_size()
    right, left = (r + 1) % p, (r - 1) % p
    chunks = x.tensor_split(p)
    for s in range(p - 1):
        give, take = (r - s - 1) % p, (r - s - 2) % p
        inbox = torch.empty(chunks[take].shape)
        req = dist.irecv(inbox, left)
        dist.send(chunks[give].contiguous(), right)
        req.wait()
        chunks[take].add_(inbox)
    for s in range(p - 1):
        give, take = (r - s) % p, (r - s - 1) % p
        inbox = torch.empty(chunks[take].shape)
        req = dist.irecv(inbox, left)
        dist.send(chunks[give].contiguous(), right)
        req.wait()
        chunks[take].copy_(inbox)
    return x
