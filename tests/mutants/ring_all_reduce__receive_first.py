"""Every rank posts a blocking recv before its send: each waits for a message its left
neighbour will only send after its own recv returns (pytorch/tutorials#3009). A deadlock."""
import torch
import torch.distributed as dist

CAUGHT_BY = "n = 10007 float32 numbers (p does not divide n)"
HINT = "a rank waited for a message that never came: each receive needs a send"


def ring_all_reduce(x):
    r, p = dist.get_rank(), dist.get_world_size()
    chunks = x.tensor_split(p)
    inbox = torch.empty_like(chunks[0])
    for lag in (1, 0):
        for s in range(p - 1):
            give = (r - s - lag) % p
            take = (give - 1) % p
            incoming = inbox[:chunks[take].numel()]
            dist.recv(incoming, (r - 1) % p)
            dist.send(chunks[give], (r + 1) % p)
            if lag:
                chunks[take].add_(incoming)
            else:
                chunks[take].copy_(incoming)
