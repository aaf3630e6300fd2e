"""Cuts x with torch.chunk, which gives fewer than p chunks when n is small (n = 5, p = 4:
three chunks), so ranks index chunks that do not exist."""
import torch
import torch.distributed as dist

CAUGHT_BY = "n = p + 1 float32 numbers (fewer than two per chunk)"
HINT = "x.tensor_split(p) always gives p chunks"


def ring_all_reduce(x):
    r, p = dist.get_rank(), dist.get_world_size()
    chunks = x.chunk(p)
    inbox = torch.empty_like(chunks[0])
    for lag in (1, 0):
        for s in range(p - 1):
            give = (r - s - lag) % p
            take = (give - 1) % p
            incoming = inbox[:chunks[take].numel()]
            req = dist.irecv(incoming, (r - 1) % p)
            dist.send(chunks[give], (r + 1) % p)
            req.wait()
            if lag:
                chunks[take].add_(incoming)
            else:
                chunks[take].copy_(incoming)
