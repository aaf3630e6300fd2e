"""Every collective of torch.distributed, rebuilt from point-to-point send/recv alone.

    broadcast(tensor, src=0)               src's tensor -> everyone
    reduce(tensor, dst=0, op=SUM)          op over everyone's tensor -> dst
    all_reduce(tensor, op=SUM, algorithm="ring", trace=None)
                                           op over everyone's tensor -> everyone
    all_gather(tensor_list, tensor)        everyone's tensor -> everyone's list
    gather(tensor, gather_list, dst=0)     everyone's tensor -> dst's list
    scatter(tensor, scatter_list, src=0)   src's list[i] -> rank i
    reduce_scatter(output, input_list, op=SUM)   op over everyone's input_list[i] -> rank i
    barrier()                              nobody leaves before everyone arrived

Same signatures (less group= and async_op=) and in-place semantics as torch.distributed's
functions of the same name: results land in the tensors passed in; reduce leaves the
non-destination ranks' tensors unchanged and reduce_scatter its inputs. Any world size,
any tensor: empty, 0-d, non-contiguous (we work on a contiguous copy and copy back), on the
CPU (gloo) or a GPU (NCCL; temporaries are made on the tensor's device).

DIST_SGD_VERBOSE=1 prints every send and receive: `[rank r] send -> peer p chunk c (n bytes)`.
The algorithms themselves live in allreduce.py.
"""
import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from .allreduce import (ALGORITHMS, ALL_REDUCE_ALGORITHMS, ring_all_gather, ring_reduce_scatter,
                        tree_broadcast, tree_reduce)
from .wire import Link
from .launch import device

__all__ = ["broadcast", "reduce", "all_reduce", "all_gather", "gather", "scatter",
           "reduce_scatter", "barrier", "ALL_REDUCE_ALGORITHMS", "ReduceOp"]


# ---- checks: fail loudly, on this rank, before any message is sent ------------------------

# In place, so a reduction allocates nothing (out= is torch.minimum's in-place form).
# A list, not a dict: ReduceOp(ReduceOp.SUM) and ReduceOp.SUM compare equal but hash differently.
_REDUCERS = [(ReduceOp.SUM, lambda acc, x: acc.add_(x)),
             (ReduceOp.PRODUCT, lambda acc, x: acc.mul_(x)),
             (ReduceOp.MIN, lambda acc, x: torch.minimum(acc, x, out=acc)),
             (ReduceOp.MAX, lambda acc, x: torch.maximum(acc, x, out=acc))]


def reducer(op):
    """The in-place function acc <- op(acc, x) for a torch.distributed ReduceOp."""
    if isinstance(op, (ReduceOp, ReduceOp.RedOpType)):
        for known, fn in _REDUCERS:
            if op == known:
                return fn
    raise ValueError(f"op must be one of ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, "
                     f"ReduceOp.MAX; got {op!r}")



def _world():
    if not dist.is_initialized():
        raise RuntimeError("no process group: call this inside dist_sgd.launch.launch(...) "
                           "or after torch.distributed.init_process_group")
    return dist.get_rank(), dist.get_world_size()


def _check_tensor(t, name):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")


def _check_rank(value, name, size):
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < size:
        raise ValueError(f"{name} must be a rank in 0..{size - 1} (world size {size}), got {value!r}")


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


# ---- the collectives -----------------------------------------------------------------------

@torch.no_grad()  # like torch's: never recorded by autograd, fine on parameters
def broadcast(tensor, src=0):
    """Copy src's tensor into everyone's `tensor`, down a binomial tree (log2(p) rounds)."""
    _check_tensor(tensor, "tensor")
    rank, size = _world()
    _check_rank(src, "src", size)
    flat = _flat(tensor)
    link = Link("broadcast")
    tree_broadcast(link, flat, root=src)
    link.flush()
    if rank != src:
        _copy_back(tensor, flat)


@torch.no_grad()
def reduce(tensor, dst=0, op=ReduceOp.SUM):
    """Combine everyone's tensor with op into dst's `tensor`, up a binomial tree.

    Only dst's tensor changes: inner tree nodes reduce into a copy of their own.
    """
    _check_tensor(tensor, "tensor")
    fn = reducer(op)
    rank, size = _world()
    _check_rank(dst, "dst", size)
    flat = _flat(tensor)
    link = Link("reduce")
    result = tree_reduce(link, flat, fn, root=dst, inplace=(rank == dst))
    link.flush()
    if rank == dst:
        _copy_back(tensor, result)


@torch.no_grad()
def all_reduce(tensor, op=ReduceOp.SUM, algorithm="ring", trace=None):
    """Combine everyone's tensor with op; every rank ends with the same bytes in `tensor`.

    algorithm: one of ALL_REDUCE_ALGORITHMS (see allreduce.py for what each costs).
    trace: a list to which this rank appends one dict per message it sends:
    {"algorithm", "phase", "step", "src", "dst", "chunk", "numel", "nbytes"}.
    """
    _check_tensor(tensor, "tensor")
    fn = reducer(op)
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown all-reduce algorithm {algorithm!r}; "
                         f"choose one of {', '.join(ALL_REDUCE_ALGORITHMS)}")
    rank, size = _world()
    if size == 1 or tensor.numel() == 0:
        return  # nothing to combine; every rank sees the same size, so all return here
    flat = _flat(tensor)
    link = Link(algorithm, trace)
    ALGORITHMS[algorithm](link, flat, fn)
    link.flush()  # every send done: the caller may now change the tensor
    _copy_back(tensor, flat)


@torch.no_grad()
def reduce_scatter(output, input_list, op=ReduceOp.SUM):
    """Rank i gets op over everyone's input_list[i]: the ring's first phase.

    The inputs stay unchanged: the ring reduces into one concatenated working copy.
    """
    _check_tensor(output, "output")
    fn = reducer(op)
    rank, size = _world()
    _check_list(input_list, "input_list", output, size)
    n = output.numel()
    work = torch.cat([t.reshape(-1) for t in input_list]) if n else output.new_empty(0)
    chunks = [work[i * n:(i + 1) * n] for i in range(size)]
    link = Link("reduce_scatter")
    ring_reduce_scatter(link, chunks, fn)
    link.flush()
    output.copy_(chunks[rank].view(output.shape))


@torch.no_grad()
def all_gather(tensor_list, tensor):
    """Everyone's tensor into everyone's tensor_list (entry i from rank i): the ring's second
    phase, receiving straight into the list's tensors when they are contiguous."""
    _check_tensor(tensor, "tensor")
    rank, size = _world()
    _check_list(tensor_list, "tensor_list", tensor, size)
    chunks = [_flat(t) for t in tensor_list]
    chunks[rank].copy_(tensor.reshape(-1))
    link = Link("all_gather")
    ring_all_gather(link, chunks)
    link.flush()
    for t, flat in zip(tensor_list, chunks):
        _copy_back(t, flat)


@torch.no_grad()
def gather(tensor, gather_list=None, dst=0):
    """Everyone's tensor into dst's gather_list (entry i from rank i); others pass None."""
    _check_tensor(tensor, "tensor")
    rank, size = _world()
    _check_rank(dst, "dst", size)
    link = Link("gather")
    if rank != dst:
        if gather_list:
            raise ValueError("gather_list must be None (or empty) on non-destination ranks")
        link.isend(_flat(tensor), dst, chunk=rank)
        link.flush()
        return
    _check_list(gather_list, "gather_list", tensor, size)
    flats = [_flat(t) for t in gather_list]
    # Post every receive at once: the senders' messages may arrive in any order.
    works = [w for i in range(size) if i != rank for w in link.irecv(flats[i], i, chunk=i)]
    flats[rank].copy_(tensor.reshape(-1))
    for work in works:
        work.wait()
    for t, flat in zip(gather_list, flats):
        _copy_back(t, flat)


@torch.no_grad()
def scatter(tensor, scatter_list=None, src=0):
    """src's scatter_list[i] into rank i's tensor; others pass None."""
    _check_tensor(tensor, "tensor")
    rank, size = _world()
    _check_rank(src, "src", size)
    link = Link("scatter")
    if rank != src:
        if scatter_list:
            raise ValueError("scatter_list must be None (or empty) on non-source ranks")
        flat = _flat(tensor)
        link.recv(flat, src, chunk=rank)
        _copy_back(tensor, flat)
        return
    _check_list(scatter_list, "scatter_list", tensor, size)
    pieces = [_flat(t) for t in scatter_list]  # kept alive until the sends are done
    for i in range(size):
        if i != rank:  # all at once: rank 2 need not wait until rank 1 has its piece
            link.isend(pieces[i], i, chunk=i)
    tensor.copy_(scatter_list[rank])
    link.flush()


@torch.no_grad()
def barrier():
    """Nobody returns before everyone has called barrier(): a dissemination barrier.

    In round k every rank signals the rank 2^k ahead and waits for the one 2^k behind;
    after ceil(log2(p)) rounds each rank has heard, indirectly, from all the others.
    """
    rank, size = _world()
    # The token must live where the backend can send it: this rank's GPU under NCCL.
    token, got = torch.zeros(1, device=device()), torch.empty(1, device=device())
    link, dist_k, step = Link("barrier"), 1, 0
    while dist_k < size:
        link.at("barrier", step).exchange(token, (rank + dist_k) % size, got, (rank - dist_k) % size)
        dist_k, step = dist_k * 2, step + 1
    link.flush()
