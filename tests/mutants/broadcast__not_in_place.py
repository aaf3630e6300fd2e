"""Receives into a new tensor and rebinds the name: the caller's tensor never changes."""
import torch
import torch.distributed as dist

CAUGHT_BY = "n = 1001 float32 numbers from src = p - 1"
HINT = "this rank still holds its own values"


def broadcast(tensor, src):
    rank, size = dist.get_rank(), dist.get_world_size()
    me, have = (rank - src) % size, 1
    while have < size:
        if me < have and me + have < size:
            dist.send(tensor, (rank + have) % size)
        elif have <= me < 2 * have:
            buf = torch.empty_like(tensor)
            dist.recv(buf, (rank - have) % size)
            tensor = buf
        have *= 2
    return tensor
