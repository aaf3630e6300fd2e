"""One buffer to send from and receive into: the odd ranks, which receive first, overwrite
what they were about to pass on, so their own tensor never leaves them."""
import torch.distributed as dist

CAUGHT_BY = "a 3 x 5 float32 tensor: the sum against dist.all_reduce"
HINT = "pass on exactly what arrived, in a buffer of"


def ring_sum(tensor):
    rank, size = dist.get_rank(), dist.get_world_size()
    total, buf = tensor.clone(), tensor.clone()
    for _ in range(size - 1):
        if rank % 2 == 0:
            dist.send(buf, (rank + 1) % size)
            dist.recv(buf, (rank - 1) % size)
        else:
            dist.recv(buf, (rank - 1) % size)
            dist.send(buf, (rank + 1) % size)
        total += buf
    return total
