"""Every rank sums every chunk itself: the ranks' own chunks travel around the ring (one chunk
a message), and each rank adds them up in the order they reach it. The sums agree to rounding,
but each rank adds in another order, so from p = 3 the ranks hold different bytes (and every
rank sends the whole tensor p - 1 times). In the ring each chunk is summed once, by one rank,
then copied around as it is."""
import torch
import torch.distributed as dist

CAUGHT_BY = "n = 10007 float32 numbers (p does not divide n)"
HINT = "each chunk must be summed once, by one rank, then copied around unchanged"


def ring_all_reduce(x):
    r, p = dist.get_rank(), dist.get_world_size()
    right, left = (r + 1) % p, (r - 1) % p
    total = x.clone()
    for c, chunk in enumerate(x.tensor_split(p)):
        travelling = chunk.clone()
        for _ in range(p - 1):
            inbox = torch.empty_like(travelling)
            recv = dist.irecv(inbox, left)
            dist.isend(travelling, right).wait()
            recv.wait()
            total.tensor_split(p)[c].add_(inbox)
            travelling = inbox
    x.copy_(total)
