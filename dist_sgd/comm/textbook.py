"""broadcast, all_gather and reduce_scatter as a textbook writes them: isend/irecv, nothing else.

    broadcast(tensor, src)              a binomial tree from src: ceil(log2 p) rounds, p-1 messages
    all_gather(tensor_list, tensor)     a ring: p-1 steps, each rank passes on what it got last
    reduce_scatter(output, input_list)  a ring: p-1 steps, each rank adds what arrives (SUM)

Lesson 03 runs these beside torch's, and they are the course's exercises of the same names
(the course's `start broadcast` writes yours): torch.distributed's signatures (less group=
and async_op=), in place like torch's, with the library's argument checks, on contiguous
tensors like torch's (on a GPU over gloo: through host copies, wire.through_host).
dist_sgd.comm.collectives runs the same tree and ring (allreduce.py)
over wire.Link, which adds what a library needs on the way: the trace, DIST_SGD_VERBOSE, every
reduce op, non-contiguous tensors and the equal-size check of TORCH_DISTRIBUTED_DEBUG=DETAIL.
"""
import torch
import torch.distributed as dist

from dist_sgd.comm.collectives import _check_list, _check_rank, _check_tensor
from dist_sgd.comm.wire import through_host
from dist_sgd.plumbing.mine import swap_in
from dist_sgd.plumbing.rank import world


@through_host
def broadcast(tensor, src):
    """Copy src's tensor into everyone's `tensor`, down a binomial tree: in each round every
    rank that has it sends it on, so the ranks that have it double (ceil(log2 p) rounds)."""
    _check_tensor(tensor, "tensor")
    rank, size = world("broadcast")
    _check_rank(src, "src", size)
    # ---- exercise broadcast: down a binomial tree from src, each rank receiving once
    me = (rank - src) % size  # ranks numbered from src: src is 0, the next one 1, ...
    have = 1  # ranks 0 .. have-1 (numbered from src) hold the tensor
    while have < size:
        if me < have and me + have < size:
            dist.send(tensor, (rank + have) % size)
        elif have <= me < 2 * have:
            dist.recv(tensor, (rank - have) % size)
        have *= 2
    # ---- end of exercise


@through_host
def all_gather(tensor_list, tensor):
    """Everyone's tensor into everyone's tensor_list (entry i from rank i), around a ring."""
    _check_tensor(tensor, "tensor")
    rank, size = world("all_gather")
    _check_list(tensor_list, "tensor_list", tensor, size)
    # ---- exercise all_gather: p-1 steps around a ring, each rank passing on what it got last
    right, left = (rank + 1) % size, (rank - 1) % size
    tensor_list[rank].copy_(tensor)
    for step in range(size - 1):  # pass entry r-s on; entry r-s-1 arrives, straight into place
        give, take = (rank - step) % size, (rank - step - 1) % size
        ops = [dist.P2POp(dist.irecv, tensor_list[take], left),  # the receive posted first
               dist.P2POp(dist.isend, tensor_list[give], right)]
        for request in dist.batch_isend_irecv(ops):  # NCCL needs the pair launched together
            request.wait()
    # ---- end of exercise


@through_host
def reduce_scatter(output, input_list):
    """Rank i's output: the sum over every rank of its input_list[i], around a ring. The
    inputs stay as they were."""
    _check_tensor(output, "output")
    rank, size = world("reduce_scatter")
    _check_list(input_list, "input_list", output, size)
    # ---- exercise reduce_scatter: p-1 steps around a ring, each rank adding what arrives
    right, left = (rank + 1) % size, (rank - 1) % size
    partial = [t.clone() for t in input_list]  # the sums so far: the inputs stay unchanged
    inbox = torch.empty_like(output)
    for step in range(size - 1):  # send entry r-s-1 on; add entry r-s-2, arriving, into ours
        give, take = (rank - step - 1) % size, (rank - step - 2) % size
        ops = [dist.P2POp(dist.irecv, inbox, left),  # the receive posted first
               dist.P2POp(dist.isend, partial[give], right)]
        for request in dist.batch_isend_irecv(ops):  # NCCL needs the pair launched together
            request.wait()
        partial[take] += inbox  # one more rank's share: entry r is complete after p-1 steps
    output.copy_(partial[rank])
    # ---- end of exercise


# DIST_SGD_MINE: a learner's versions replace these
swap_in(globals(), "broadcast", ("broadcast",), lesson="03")
swap_in(globals(), "all_gather", ("all_gather",), lesson="03")
swap_in(globals(), "reduce_scatter", ("reduce_scatter",), lesson="03")
