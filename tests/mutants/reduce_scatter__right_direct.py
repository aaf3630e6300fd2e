"""A correct reduce_scatter without a ring: rank j needs everyone's entry j, so each rank
sends entry j straight to rank j (p - 1 messages) and adds up the p - 1 it receives."""
import torch
import torch.distributed as dist


def reduce_scatter(output, input_list):
    me, p = dist.get_rank(), dist.get_world_size()
    bufs = {src: torch.empty_like(output) for src in range(p) if src != me}
    reqs = [dist.irecv(b, src) for src, b in bufs.items()]
    reqs += [dist.isend(input_list[dst].contiguous(), dst) for dst in range(p) if dst != me]
    for r in reqs:
        r.wait()
    acc = input_list[me].clone()
    for src in range(p):
        if src != me:
            acc += bufs[src]
    output.copy_(acc)
