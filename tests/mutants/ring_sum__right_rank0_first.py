"""A correct ring from the textbook's other fix: only rank 0 sends first, every other rank
receives first, which breaks the cycle of waits (the steps then run one after another)."""
import torch.distributed as dist


def ring_sum(x):
    me, n = dist.get_rank(), dist.get_world_size()
    acc = x.clone()
    outgoing = x.clone()
    for _ in range(n - 1):
        incoming = x.new_empty(x.shape)
        if me == 0:
            dist.send(outgoing, (me + 1) % n)
            dist.recv(incoming, (me - 1) % n)
        else:
            dist.recv(incoming, (me - 1) % n)
            dist.send(outgoing, (me + 1) % n)
        acc.add_(incoming)
        outgoing = incoming
    return acc
