"""Gathers everything at rank 0, which sends the whole list to every rank: the right lists,
but rank 0 sends p - 1 whole lists, (p - 1) p tensors instead of p - 1."""
import torch.distributed as dist

CAUGHT_BY = "bytes sent per rank for n = 10000 float32 numbers"
HINT = "send one tensor per message, never the whole"


def all_gather(tensor_list, tensor):
    rank, size = dist.get_rank(), dist.get_world_size()
    tensor_list[rank].copy_(tensor)
    if rank == 0:
        for src in range(1, size):
            dist.recv(tensor_list[src], src)
        for dst in range(1, size):
            for t in tensor_list:
                dist.send(t, dst)
    else:
        dist.send(tensor, 0)
        for t in tensor_list:
            dist.recv(t, 0)
