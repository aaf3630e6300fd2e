"""Counts the steps from 1 to p - 1, range(1, p - 1), one short: at p = 2 the ring makes no
step at all, and sends nothing (each rank keeps its own x); at larger p the last step of each
phase is missing. Each phase takes p - 1 steps: range(p - 1)."""
import torch
import torch.distributed as dist

CAUGHT_BY = "bytes sent per rank for n = 40000 float32 numbers"
HINT = "every rank sends to its right neighbour, (rank + 1) % p"


def ring_all_reduce(x):
    r, p = dist.get_rank(), dist.get_world_size()
    right, left = (r + 1) % p, (r - 1) % p
    chunks = x.tensor_split(p)
    for phase in range(2):
        for step in range(1, p - 1):
            give = (r - step + phase) % p
            take = (give - 1) % p
            inbox = torch.empty_like(chunks[take])
            recv = dist.irecv(inbox, left)
            dist.isend(chunks[give], right).wait()
            recv.wait()
            if phase == 0:
                chunks[take].add_(inbox)
            else:
                chunks[take].copy_(inbox)
