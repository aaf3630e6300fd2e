"""The tree starts at rank 0 whatever src is (ranks not renumbered from src): right when
src = 0, rank 0's tensor everywhere otherwise."""
import torch.distributed as dist

CAUGHT_BY = "n = 1001 float32 numbers from src = p - 1"
HINT = ("rank 0's tensor arrived, not src's: number the",
        "this rank still holds its own values")


def broadcast(tensor, src):
    rank, size = dist.get_rank(), dist.get_world_size()
    have = 1
    while have < size:
        if rank < have and rank + have < size:
            dist.send(tensor, rank + have)
        elif have <= rank < 2 * have:
            dist.recv(tensor, rank - have)
        have *= 2
