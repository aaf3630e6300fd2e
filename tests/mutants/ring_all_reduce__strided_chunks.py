"""Cuts x into p interleaved chunks, x[i::p] (every p-th number): views of x, so the result
would land in place, but strided ones, which isend refuses (a message is a contiguous run of
bytes). tensor_split's chunks are contiguous slices; a strided piece must be sent as a
.contiguous() copy, with the arrived values copied back."""
import torch
import torch.distributed as dist

CAUGHT_BY = "n = 10007 float32 numbers (p does not divide n)"
HINT = "send a chunk of x itself (a view), or .contiguous() a copy"


def ring_all_reduce(x):
    r, p = dist.get_rank(), dist.get_world_size()
    right, left = (r + 1) % p, (r - 1) % p
    chunks = [x[i::p] for i in range(p)]  # views into x, one every p numbers
    for phase in range(2):
        for step in range(p - 1):
            give = (r - step - 1 + phase) % p
            take = (give - 1) % p
            inbox = torch.empty_like(chunks[take])
            recv = dist.irecv(inbox, left)
            dist.isend(chunks[give], right).wait()
            recv.wait()
            if phase == 0:
                chunks[take].add_(inbox)
            else:
                chunks[take].copy_(inbox)
