"""Works on a copy (x.chunk(...) of x.clone()) and returns the sum: x itself is unchanged."""
import torch
import torch.distributed as dist

CAUGHT_BY = "n = 10007 float32 numbers (p does not divide n)"
HINT = "this rank still holds its own values"


def ring_all_reduce(x):
    r, p = dist.get_rank(), dist.get_world_size()
    chunks = list(x.clone().tensor_split(p))
    for lag in (1, 0):
        for s in range(p - 1):
            give = (r - s - lag) % p
            take = (give - 1) % p
            incoming = torch.empty_like(chunks[take])
            req = dist.irecv(incoming, (r - 1) % p)
            dist.send(chunks[give], (r + 1) % p)
            req.wait()
            chunks[take] = chunks[take] + incoming if lag else incoming
    return torch.cat(chunks)
