"""Every rank calls its blocking send before its receive: each send waits for a receive its
right neighbour only posts after its own send returns. A deadlock, whatever the size on
gloo (its blocking send waits for the receiver); on other transports at least for big ones."""
import torch
import torch.distributed as dist

CAUGHT_BY = "a 3 x 5 float32 tensor: the sum against dist.all_reduce"
HINT = "a rank waited for a message that never came: a blocking send waits for"


def ring_sum(tensor):
    rank, size = dist.get_rank(), dist.get_world_size()
    total, travelling = tensor.clone(), tensor
    for _ in range(size - 1):
        arrived = torch.empty_like(travelling)
        dist.send(travelling, (rank + 1) % size)
        dist.recv(arrived, (rank - 1) % size)
        total += arrived
        travelling = arrived
    return total
