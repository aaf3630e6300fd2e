"""Synchronize replicas by hand: average the gradients, broadcast the weights.

    loss.backward()                      # each rank: gradient of its own shard's mean loss
    average_gradients(model)             # now every rank holds the mean over all ranks
    optimizer.step()                     # same gradient + same weights -> same new weights

Why the mean of the ranks' gradients is the full-batch gradient: with equal per-rank batches
of b items and the loss a mean over the batch, the gradient of the mean loss over the global
batch of R*b items is (1/R) * sum over ranks of (gradient of rank r's mean loss). So: all-reduce
with SUM, then divide by the world size. torch.distributed can do both in one call
(ReduceOp.AVG, on NCCL and, in torch 2.14, on gloo; ours in dist_sgd.comm.collectives has it
too), but the tutorial writes the division out, and so do we: one code path, SUM then divide,
for whichever all_reduce is passed in keeps torch's results and ours identical.

Which parameters take part, and why every rank must skip the same ones: gradients_to_sync's
docstring.
"""
import zlib

import torch
import torch.distributed as dist
import torch.nn as nn

from dist_sgd.comm.flat import copy_back, flatten
from dist_sgd.plumbing.mine import swap_in
from dist_sgd.plumbing.rank import world


def _unique(params):
    """Parameters in order, each once (a plain list of tensors may repeat a tied one)."""
    seen = set()
    for p in params:
        if id(p) not in seen:
            seen.add(id(p))
            yield p


def gradients_to_sync(model):
    """The .grad tensors average_gradients reduces, in model.parameters() order.

    `model` is an nn.Module or an iterable of parameters.

    Which parameters take part: those with requires_grad=True whose .grad is not None. Frozen
    parameters and parameters that got no gradient this step (unused in the forward pass) are
    skipped. Every rank must skip the same ones, because the all-reduces are matched up by
    order: if rank 0 skips a parameter that rank 1 reduces, their calls pair up with the wrong
    tensors (flat=False) or differ in size (flat=True) - an error or a hang, not a wrong number.
    Parameters shared by two modules (tied weights) appear once in model.parameters(), so their
    gradient, already the sum over both uses, is reduced once.
    """
    params = model.parameters() if isinstance(model, nn.Module) else model
    grads = []
    for p in _unique(params):
        if not p.requires_grad or p.grad is None:
            continue  # frozen, or unused in this forward pass: nothing to average
        if p.grad.is_sparse:
            raise ValueError("average_gradients handles dense gradients only (got a sparse one, "
                             "e.g. from nn.Embedding(sparse=True))")
        grads.append(p.grad)
    return grads


def _average_flat(grads, all_reduce, world_size):
    """flat=True: one all-reduce per (dtype, device) over a buffer holding every gradient."""
    groups = {}  # torch.cat needs one dtype and device per buffer
    for g in grads:
        groups.setdefault((g.dtype, g.device), []).append(g)
    for group in groups.values():
        buffer = flatten(group)
        all_reduce(buffer, op=dist.ReduceOp.SUM)
        buffer.div_(world_size)
        copy_back(buffer, group)
    return len(groups)


def average_gradients(model, flat=False, all_reduce=None):
    """Replace every gradient by its mean over all ranks, in place. Returns the number of
    all-reduce calls made.

    flat=False: the tutorial's version, one all-reduce per parameter (Net: 8 calls).
    flat=True: copy all gradients into one flat buffer (one per dtype and device), all-reduce
    it once and copy the results back: one message start-up cost instead of one per tensor,
    at the price of two copies - the idea DDP's buckets refine.
    all_reduce: None for torch.distributed.all_reduce, or any function with the same in-place
    signature, e.g. dist_sgd.comm.collectives.all_reduce.
    """
    _, world_size = world("average_gradients")
    all_reduce = all_reduce or dist.all_reduce
    if flat:
        return _average_flat(gradients_to_sync(model), all_reduce, world_size)
    # ---- exercise average_gradients: all-reduce every gradient (SUM), divide by the world size
    grads = gradients_to_sync(model)  # each parameter once; frozen and unused ones skipped
    for g in grads:
        # Collectives need contiguous memory; a rare non-contiguous .grad goes through a copy.
        work = g if g.is_contiguous() else g.contiguous()
        all_reduce(work, op=dist.ReduceOp.SUM)  # now the sum over every rank, on every rank
        work.div_(world_size)  # the mean: the gradient of the global batch's mean loss
        if work is not g:
            g.copy_(work)
    return len(grads)
    # ---- end of exercise


def broadcast_parameters(model, src=0, broadcast=None):
    """Copy rank src's parameters and buffers (e.g. BatchNorm statistics) to every rank.

    Ranks that initialize their models from different seeds start from the same weights
    after this; it is what DDP does at construction. Returns the number of tensors sent.
    broadcast: None for torch.distributed.broadcast, or e.g. dist_sgd.comm.collectives.broadcast.
    A model that differs from rank src's (other shapes, other tensors) raises ValueError on
    every rank, instead of a hang or a garbled broadcast.
    """
    _, world_size = world("broadcast_parameters")
    if not 0 <= src < world_size:
        raise ValueError(f"src must be a rank in [0, {world_size - 1}], got {src}")
    broadcast = broadcast or dist.broadcast
    tensors = list(_unique(model.parameters())) + list(model.buffers())
    _check_same_shapes(tensors, src)
    with torch.no_grad():  # writing into leaf parameters in place must not be recorded
        for t in tensors:
            work = t.detach()  # shares t's memory: receiving into it updates the parameter
            if work.is_contiguous():
                broadcast(work, src=src)
            else:
                tmp = work.contiguous()
                broadcast(tmp, src=src)
                work.copy_(tmp)
    return len(tensors)


def _check_same_shapes(tensors, src):
    """Everyone compares (count, elements, shape checksum) with rank src's: one small broadcast."""
    shapes = str([tuple(t.shape) for t in tensors]).encode()
    mine = [len(tensors), sum(t.numel() for t in tensors), zlib.crc32(shapes)]
    device = tensors[0].device if tensors else torch.device("cpu")
    theirs = torch.tensor(mine, dtype=torch.int64, device=device)
    dist.broadcast(theirs, src)
    if theirs.tolist() != mine:
        raise ValueError(f"rank {dist.get_rank()}: the model differs from rank {src}'s "
                         f"(tensors, elements, shape checksum: {mine} here, {theirs.tolist()} "
                         f"on rank {src})")


# DIST_SGD_MINE: a learner's version replaces ours
swap_in(globals(), "average_gradients", ("average_gradients",), lesson="06")
