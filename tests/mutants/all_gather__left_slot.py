"""Stores every arrival in the left neighbour's entry: right for the first step only, where
the arriving tensor is the left neighbour's; later ones are ranks further back."""
import torch.distributed as dist

CAUGHT_BY = "n = 7 float32 numbers per rank"
HINT = "at step s the tensor arriving from the left is"


def all_gather(tensor_list, tensor):
    rank, size = dist.get_rank(), dist.get_world_size()
    left, right = (rank - 1) % size, (rank + 1) % size
    tensor_list[rank].copy_(tensor)
    travelling = tensor.clone()
    for _ in range(size - 1):
        req = dist.irecv(tensor_list[left], left)
        dist.send(travelling, right)
        req.wait()
        travelling = tensor_list[left].clone()
