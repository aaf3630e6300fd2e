"""Every rank sends its whole input_list to every other rank, and each adds up its own entry:
the right sums, but each rank sends (p - 1) p entries where p - 1 are needed."""
import torch
import torch.distributed as dist

CAUGHT_BY = "bytes sent per rank for entries of n = 10000 float32 numbers"
HINT = "each entry (partly summed) travels once per"


def reduce_scatter(output, input_list):
    rank, size = dist.get_rank(), dist.get_world_size()
    whole = torch.stack(list(input_list))
    theirs = {src: torch.empty_like(whole) for src in range(size) if src != rank}
    requests = [dist.irecv(buf, src) for src, buf in theirs.items()]
    requests += [dist.isend(whole, dst) for dst in range(size) if dst != rank]
    for r in requests:
        r.wait()
    total = input_list[rank].clone()
    for src in sorted(theirs):
        total += theirs[src][rank]
    output.copy_(total)
