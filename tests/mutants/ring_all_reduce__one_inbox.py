"""One inbox for every step, the size of chunk 0: when p does not divide n the chunks differ
in length (tensor_split makes the first ones one longer), and a shorter chunk's message does
not fill the inbox (gloo refuses the size mismatch). Each receive needs a buffer the size of
the chunk that arrives (adding a 3336-number inbox into a 3335-number chunk fails)."""
import torch
import torch.distributed as dist

CAUGHT_BY = "n = 10007 float32 numbers (p does not divide n)"
HINT = "each message must be one chunk on both sides"


def ring_all_reduce(x):
    r, p = dist.get_rank(), dist.get_world_size()
    right, left = (r + 1) % p, (r - 1) % p
    chunks = x.tensor_split(p)
    inbox = torch.empty_like(chunks[0])
    for s in range(p - 1):
        give, take = (r - s - 1) % p, (r - s - 2) % p
        req = dist.irecv(inbox, left)
        dist.send(chunks[give].contiguous(), right)
        req.wait()
        chunks[take].add_(inbox)
    for s in range(p - 1):
        give, take = (r - s) % p, (r - s - 1) % p
        req = dist.irecv(inbox, left)
        dist.send(chunks[give].contiguous(), right)
        req.wait()
        chunks[take].copy_(inbox)
    return x
