"""A correct binomial tree written the MPICH way (not the reference's): a rank hears from the
rank its lowest set bit below it (numbered from src), then sends to the ranks 2^k above it
for every bit below that one, the biggest subtree first, with isend/irecv."""
import torch.distributed as dist


def broadcast(tensor, src):
    rank, size = dist.get_rank(), dist.get_world_size()
    rel = (rank - src + size) % size
    mask = 1
    while mask < size:
        if rel & mask:
            dist.irecv(tensor, (rank - mask + size) % size).wait()
            break
        mask <<= 1
    mask >>= 1
    while mask > 0:
        if rel + mask < size:
            dist.isend(tensor, (rank + mask) % size).wait()
        mask >>= 1
