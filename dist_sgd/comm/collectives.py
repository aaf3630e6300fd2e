"""Every collective of torch.distributed, rebuilt from point-to-point send/recv alone.

    broadcast(tensor, src=0)               src's tensor -> everyone
    reduce(tensor, dst=0, op=SUM)          op over everyone's tensor -> dst
    all_reduce(tensor, op=SUM, algorithm="ring", trace=None)   op over all -> everyone
    all_gather(tensor_list, tensor)        everyone's tensor -> everyone's list
    gather(tensor, gather_list, dst=0)     everyone's tensor -> dst's list
    scatter(tensor, scatter_list, src=0)   src's list[i] -> rank i
    reduce_scatter(output, input_list, op=SUM)   op over everyone's input_list[i] -> rank i
    barrier()                              nobody leaves before everyone arrived

torch.distributed's signatures (less async_op=) and in-place results, for any world size and
tensor (empty, 0-d, non-contiguous), on CPU (gloo) or GPU (NCCL), group= as torch's (roots are
global ranks; a rank outside the group returns at once). Gloo's reduce ops and results, except
that MIN and MAX propagate every NaN; what gloo refuses raises on every rank before a message
is sent. DIST_SGD_VERBOSE=1 prints every send and receive; the algorithms are allreduce.py's.
"""
import os
import zlib

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from dist_sgd.comm.allreduce import (ALGORITHMS, ALL_REDUCE_ALGORITHMS, ring_all_gather,
                                     ring_reduce_scatter, tree_broadcast, tree_reduce)
from dist_sgd.comm.wire import Link
from dist_sgd.plumbing.rank import device, world

__all__ = ["broadcast", "reduce", "all_reduce", "all_gather", "gather", "scatter",
           "reduce_scatter", "barrier", "ALL_REDUCE_ALGORITHMS", "ReduceOp"]


# ---- checks: fail loudly, on every rank alike, before any message is sent -------------------

# What gloo reduces (torch 2.14.1, tried on each): these dtypes; int16, uint16/32/64 and the
# float8 types it refuses ("Invalid scalar type"). Ours refuses what gloo refuses.
REDUCIBLE = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
             torch.complex128, torch.uint8, torch.int8, torch.int32, torch.int64, torch.bool)

# In place, so a reduction allocates nothing (out= is torch.minimum's in-place form). AVG
# reduces like SUM; the caller divides by the world size at the end, as gloo does. On bool,
# add_ is OR and mul_ is AND, which is what gloo gives. A list, not a dict:
# ReduceOp(ReduceOp.SUM) and ReduceOp.SUM compare equal but hash differently.
_REDUCERS = [("SUM", ReduceOp.SUM, lambda acc, x: acc.add_(x)),
             ("AVG", ReduceOp.AVG, lambda acc, x: acc.add_(x)),
             ("PRODUCT", ReduceOp.PRODUCT, lambda acc, x: acc.mul_(x)),
             ("MIN", ReduceOp.MIN, lambda acc, x: torch.minimum(acc, x, out=acc)),
             ("MAX", ReduceOp.MAX, lambda acc, x: torch.maximum(acc, x, out=acc)),
             ("BAND", ReduceOp.BAND, lambda acc, x: acc.bitwise_and_(x)),
             ("BOR", ReduceOp.BOR, lambda acc, x: acc.bitwise_or_(x)),
             ("BXOR", ReduceOp.BXOR, lambda acc, x: acc.bitwise_xor_(x))]
OP_NAMES = tuple(name for name, _, _ in _REDUCERS)


def _op_name(op):
    if isinstance(op, (ReduceOp, ReduceOp.RedOpType)):
        for name, known, _ in _REDUCERS:
            if op == known:
                return name
    got = f"ReduceOp {op.op}" if isinstance(op, ReduceOp) else repr(op)  # repr has an address
    raise ValueError(f"op must be one of {', '.join('ReduceOp.' + n for n in OP_NAMES)}; got "
                     f"{got} (PREMUL_SUM is NCCL's only: gloo refuses it too)")


def reducer(op, dtype=None):
    """The in-place function acc <- op(acc, x) for a torch.distributed ReduceOp.

    With a dtype, also check that op can reduce it, the way gloo decides (TypeError if not).
    The check reads only (op, dtype), which every rank passes alike, so every rank refuses
    alike, at every world size, before any message is sent: nobody is left waiting.
    """
    name = _op_name(op)
    if dtype is not None:
        if dtype not in REDUCIBLE:
            raise TypeError(f"cannot reduce {dtype} tensors (gloo refuses them too); "
                            f"reducible dtypes: {', '.join(str(d) for d in REDUCIBLE)}")
        if dtype.is_complex and name not in ("SUM", "AVG"):
            raise TypeError(f"ReduceOp.{name} is not defined on complex tensors ({dtype}); "
                            "only SUM and AVG are (as in torch)")
        if name in ("BAND", "BOR", "BXOR") and (dtype.is_floating_point or dtype.is_complex):
            raise TypeError(f"ReduceOp.{name} is a bitwise op: it needs an integer or bool "
                            f"tensor, got {dtype} (torch refuses it too)")
        if name == "AVG" and not (dtype.is_floating_point or dtype.is_complex):
            raise TypeError(f"ReduceOp.AVG needs a floating-point or complex tensor, got {dtype}: "
                            "the average of integers is not an integer (torch fails on it too); "
                            "use SUM and divide")
    return next(fn for n, _, fn in _REDUCERS if n == name)


def _finish(op, t, size):
    """AVG is SUM divided by the world size, once, at the end (every rank divides the same
    bytes by the same number, so ranks still agree bit for bit)."""
    if _op_name(op) == "AVG":
        t.div_(size)


def _check_tensor(t, name):
    """A TypeError unless t is a dense torch.Tensor (name: the argument, for the message)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.layout != torch.strided:
        raise TypeError(f"{name} must be a dense tensor, got layout {t.layout} (sparse tensors "
                        "are not supported; torch's gloo all_reduce has its own sparse path)")


def _check_rank(value, name, size, group=None):
    """The root's rank in the group (group=None: value itself, a rank in 0..size-1), or a
    ValueError naming the argument `name`."""
    if group is not None:
        ranks = dist.get_process_group_ranks(group)
        if isinstance(value, bool) or value not in ranks:
            raise ValueError(f"{name} must be a global rank in the group {ranks}, got {value!r}")
        return ranks.index(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < size:
        raise ValueError(f"{name} must be a rank in 0..{size - 1} (world size {size}), "
                         f"got {value!r}")
    return value


def _members(group):
    """(rank, size) in group; None on a rank outside it (torch returns at once there too)."""
    rank, size = world("dist_sgd.comm.collectives", group)
    return None if rank < 0 else (rank, size)


def _check_list(tensors, name, like, size):
    """tensors must be a list of `size` tensors shaped and typed like `like`."""
    if not isinstance(tensors, (list, tuple)) or len(tensors) != size:
        got = len(tensors) if isinstance(tensors, (list, tuple)) else type(tensors).__name__
        raise ValueError(f"{name} must be a list of world size = {size} tensors, got {got}")
    for i, t in enumerate(tensors):
        _check_tensor(t, f"{name}[{i}]")
        if t.shape != like.shape:
            raise ValueError(f"{name}[{i}] has shape {tuple(t.shape)}, but the tensor has shape "
                             f"{tuple(like.shape)}: every entry must have the same shape")
        if t.dtype != like.dtype:
            raise ValueError(f"{name}[{i}] has dtype {t.dtype}, but the tensor has dtype "
                             f"{like.dtype}: every entry must have the same dtype")


def _flat(t):
    """A contiguous 1-D tensor with t's elements: a view when t is contiguous, else a copy.

    Send and receive need contiguous memory; a copy must be written back with _copy_back.
    """
    return t.view(-1) if t.is_contiguous() else t.contiguous().view(-1)


def _copy_back(t, flat):
    if flat.data_ptr() != t.data_ptr() or not t.is_contiguous():
        t.copy_(flat.view(t.shape))


def _same_everywhere(what, tensor, group=None):
    """With TORCH_DISTRIBUTED_DEBUG=DETAIL (torch's own switch for this), check that every
    rank passed as many elements of the same dtype, and raise ValueError on every rank if not.

    It costs one small all-gather per call, so it is off by default, as in torch. Without it
    a mismatch is the caller's bug, as with torch's gloo: message sizes then differ between
    sender and receiver, and gloo aborts the process ("Received data size doesn't match")
    or a receive times out.
    """
    if os.environ.get("TORCH_DISTRIBUTED_DEBUG", "").upper() != "DETAIL":
        return
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    table = torch.zeros(size, 2, dtype=torch.int64, device=tensor.device)
    table[rank, 0], table[rank, 1] = tensor.numel(), zlib.crc32(str(tensor.dtype).encode())
    ring_all_gather(Link("check", group=group), list(table))  # a contiguous table's rows
    if (table != table[0]).any():
        seen = ", ".join(f"rank {r}: {n} elements" for r, n in enumerate(table[:, 0].tolist()))
        raise ValueError(f"{what}: every rank must pass a tensor with as many elements of the "
                         f"same dtype; got {seen}" + (" (and dtypes differ)" if
                                                      (table[:, 1] != table[0, 1]).any() else ""))


# ---- the collectives -----------------------------------------------------------------------

@torch.no_grad()  # like torch's: never recorded by autograd, fine on parameters
def broadcast(tensor, src=0, group=None):
    """Copy src's tensor into everyone's `tensor`, down a binomial tree (log2(p) rounds)."""
    _check_tensor(tensor, "tensor")
    if (me := _members(group)) is None:
        return
    rank, size = me
    src = _check_rank(src, "src", size, group)
    _same_everywhere("broadcast", tensor, group)
    flat = _flat(tensor)
    tree_broadcast(Link("broadcast", group=group), flat, root=src)
    if rank != src:
        _copy_back(tensor, flat)


@torch.no_grad()
def reduce(tensor, dst=0, op=ReduceOp.SUM, group=None):
    """Combine everyone's tensor with op into dst's `tensor`, up a binomial tree.

    Only dst's tensor changes: inner tree nodes reduce into a copy of their own.
    """
    _check_tensor(tensor, "tensor")
    fn = reducer(op, tensor.dtype)
    if (me := _members(group)) is None:
        return
    rank, size = me
    dst = _check_rank(dst, "dst", size, group)
    _same_everywhere("reduce", tensor, group)
    flat = _flat(tensor)
    result = tree_reduce(Link("reduce", group=group), flat, fn, root=dst, inplace=(rank == dst))
    if rank == dst:
        _finish(op, result, size)
        _copy_back(tensor, result)


@torch.no_grad()
def all_reduce(tensor, op=ReduceOp.SUM, group=None, algorithm="ring", trace=None):
    """Combine everyone's tensor with op; every rank ends with the same bytes in `tensor`.

    algorithm: one of ALL_REDUCE_ALGORITHMS (see allreduce.py for what each costs).
    trace: a list to which this rank appends one dict per message it sends:
    {"algorithm", "phase", "step", "src", "dst", "chunk", "numel", "nbytes"}.
    """
    _check_tensor(tensor, "tensor")
    fn = reducer(op, tensor.dtype)
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown all-reduce algorithm {algorithm!r}; "
                         f"choose one of {', '.join(ALL_REDUCE_ALGORITHMS)}")
    if (me := _members(group)) is None:
        return
    rank, size = me
    _same_everywhere("all_reduce", tensor, group)
    if size == 1:
        return  # nothing to combine (and AVG of one tensor is itself)
    flat = _flat(tensor)
    ALGORITHMS[algorithm](Link(algorithm, trace, group), flat, fn)
    _finish(op, flat, size)
    _copy_back(tensor, flat)


@torch.no_grad()
def reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None):
    """Rank i gets op over everyone's input_list[i]: the ring's first phase.

    The inputs stay unchanged: the ring reduces into one concatenated working copy.
    """
    _check_tensor(output, "output")
    fn = reducer(op, output.dtype)
    if (me := _members(group)) is None:
        return
    rank, size = me
    _check_list(input_list, "input_list", output, size)
    _same_everywhere("reduce_scatter", output, group)
    n = output.numel()
    work = torch.cat([t.reshape(-1) for t in input_list])
    chunks = [work[i * n:(i + 1) * n] for i in range(size)]
    ring_reduce_scatter(Link("reduce_scatter", group=group), chunks, fn)
    _finish(op, chunks[rank], size)
    output.copy_(chunks[rank].view(output.shape))


@torch.no_grad()
def all_gather(tensor_list, tensor, group=None):
    """Everyone's tensor into everyone's tensor_list (entry i from rank i): the ring's second
    phase, receiving straight into the list's tensors when they are contiguous."""
    _check_tensor(tensor, "tensor")
    if (me := _members(group)) is None:
        return
    rank, size = me
    _check_list(tensor_list, "tensor_list", tensor, size)
    _same_everywhere("all_gather", tensor, group)
    chunks = [_flat(t) for t in tensor_list]
    chunks[rank].copy_(tensor.reshape(-1))
    ring_all_gather(Link("all_gather", group=group), chunks)
    for t, flat in zip(tensor_list, chunks):
        _copy_back(t, flat)


def _rooted(what, tensor, root, root_name, tensors, group):
    """The checks gather and scatter share: only the root passes a list. Returns (rank,
    size, root, link) in the group, or None on a rank outside it."""
    _check_tensor(tensor, "tensor")
    if (me := _members(group)) is None:
        return None
    rank, size = me
    root = _check_rank(root, root_name, size, group)
    _same_everywhere(what, tensor, group)
    if rank != root and tensors:
        raise ValueError(f"{what}_list must be None (or empty) on ranks other than {root_name}")
    return rank, size, root, Link(what, group=group)


@torch.no_grad()
def gather(tensor, gather_list=None, dst=0, group=None):
    """Everyone's tensor into dst's gather_list (entry i from rank i); others pass None."""
    if (got := _rooted("gather", tensor, dst, "dst", gather_list, group)) is None:
        return
    rank, size, dst, link = got
    if rank != dst:
        link.send(_flat(tensor), dst, chunk=rank)
        return
    _check_list(gather_list, "gather_list", tensor, size)
    flats = [_flat(t) for t in gather_list]
    # Post every receive at once: the senders' messages may arrive in any order.
    requests = link.start(recvs=[(flats[i], i, i) for i in range(size) if i != rank])
    flats[rank].copy_(tensor.reshape(-1))
    for request in requests:
        request.wait()
    for t, flat in zip(gather_list, flats):
        _copy_back(t, flat)


@torch.no_grad()
def scatter(tensor, scatter_list=None, src=0, group=None):
    """src's scatter_list[i] into rank i's tensor; others pass None."""
    if (got := _rooted("scatter", tensor, src, "src", scatter_list, group)) is None:
        return
    rank, size, src, link = got
    if rank != src:
        flat = _flat(tensor)
        link.recv(flat, src, chunk=rank)
        _copy_back(tensor, flat)
        return
    _check_list(scatter_list, "scatter_list", tensor, size)
    pieces = [_flat(t) for t in scatter_list]  # kept alive until the sends are done
    # All at once: rank 2 need not wait until rank 1 has its piece.
    requests = link.start(sends=[(pieces[i], i, i) for i in range(size) if i != rank])
    tensor.copy_(scatter_list[rank])
    for request in requests:
        request.wait()


@torch.no_grad()
def barrier(group=None):
    """Nobody returns before everyone has called barrier(): a dissemination barrier.

    In round k every rank signals the rank 2^k ahead and waits for the one 2^k behind;
    after ceil(log2(p)) rounds each rank has heard, indirectly, from all the others.
    """
    if (me := _members(group)) is None:
        return
    rank, size = me
    # The token must live where the backend can send it: this rank's GPU under NCCL.
    token, got = torch.zeros(1, device=device()), torch.empty(1, device=device())
    link, dist_k, step = Link("barrier", group=group), 1, 0
    while dist_k < size:
        link.at("barrier", step).exchange(token, (rank + dist_k) % size, got,
                                          (rank - dist_k) % size)
        dist_k, step = dist_k * 2, step + 1
