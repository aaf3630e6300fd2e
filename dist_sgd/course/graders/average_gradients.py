"""Lesson 06's average_gradients(model): every .grad replaced by its mean over the ranks, in
place, so that p ranks on their shards step as one process on the global batch."""
import copy

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from dist_sgd.course.grade import Grader
from dist_sgd.sgd.models import Awkward

grader = Grader("average_gradients", error_hints={
    "NoneType": "a parameter whose .grad is None (frozen, or not used in this forward pass) "
                "has nothing to average: skip it"})
PER_RANK = 3  # odd on purpose


def _setup(ctx, step=0):
    torch.manual_seed(0)  # the same model on every rank
    ref = Awkward().double()
    g = torch.Generator().manual_seed(7 + step)
    x = torch.randn(PER_RANK * ctx.world_size, 20, generator=g, dtype=torch.float64)
    y = torch.randint(0, 5, (PER_RANK * ctx.world_size,), generator=g)
    return ref, x, y


def _mine(ctx, x, y):
    part = slice(ctx.rank * PER_RANK, (ctx.rank + 1) * PER_RANK)
    return x[part], y[part]


@grader.case("one step of a model with frozen, unused and tied parameters")
def one_step(ctx):
    """After one backward on this rank's share and the call, every gradient equals one
    process's on the global batch (within 1e-12 + 1e-9 relative); frozen and unused
    parameters keep .grad None."""
    ref, x, y = _setup(ctx)
    model = copy.deepcopy(ref)
    F.nll_loss(ref(x), y).backward()  # one process, the global batch
    F.nll_loss(model(*_mine(ctx, x, y)[:1]), _mine(ctx, x, y)[1]).backward()
    own = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    held = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    ctx.call(ctx.impl.average_gradients, model)
    for name, grad in held.items():  # an optimizer (or a hook) may hold the .grad tensor
        ctx.expect(dict(model.named_parameters())[name].grad is grad, f"{name}.grad is a new "
                   "tensor after the call, expected the same one, averaged in place", [
                       "p.grad = p.grad / p makes a new tensor: divide in place, p.grad /= p "
                       "(or p.grad.div_(p))"])
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        if q.grad is None:
            ctx.expect(p.grad is None, f"{name}.grad is set, expected None",
                       ["a frozen or unused parameter has no gradient: leave its .grad None"])
            continue
        ctx.expect(p.grad is not None, f"{name}.grad is None after the call")
        ctx.expect_close(p.grad, q.grad, f"{name}.grad", atol=1e-12, rtol=1e-9,
                         own=own[name] if ctx.world_size > 1 else None)


@grader.case("three steps of SGD with momentum: the weights of one process")
def three_steps(ctx):
    """Three steps of torch's SGD with momentum on the averaged gradients give one process's
    weights, the same bytes on every rank."""
    ref, _, _ = _setup(ctx)
    model = copy.deepcopy(ref)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(3):
        _, x, y = _setup(ctx, step)
        opt_ref.zero_grad()
        F.nll_loss(ref(x), y).backward()
        opt_ref.step()
        opt.zero_grad()
        xs, ys = _mine(ctx, x, y)
        F.nll_loss(model(xs), ys).backward()
        ctx.call(ctx.impl.average_gradients, model)
        opt.step()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        ctx.expect_close(p.detach(), q.detach(), f"{name} after 3 steps", atol=1e-10, rtol=1e-8)
    ctx.expect_same_on_every_rank(torch.cat([p.detach().flatten() for p in model.parameters()]),
                                  "the weights after 3 steps")


@grader.case("the tied weight reduced once, the buffer left alone")
def once_each(ctx):
    """At most one all-reduce per gradient (the tied weight once), and the buffer untouched."""
    ref, x, y = _setup(ctx)
    model = copy.deepcopy(ref)
    model.running.add_(ctx.rank)  # each rank's own statistic, as a running mean would be
    before = model.running.clone()
    F.nll_loss(model(_mine(ctx, x, y)[0]), _mine(ctx, x, y)[1]).backward()
    with_grad = sum(p.grad is not None for p in model.parameters())
    reduced = []  # the storage each all-reduce was given: which tensors the piece sent
    original = dist.all_reduce

    def all_reduce(tensor, *args, **kwargs):
        reduced.append(tensor.data_ptr())
        return original(tensor, *args, **kwargs)
    dist.all_reduce = all_reduce
    try:
        ctx.call(ctx.impl.average_gradients, model)
    finally:
        dist.all_reduce = original
    buffers = {b.data_ptr() for b in model.buffers()}
    ctx.expect(torch.equal(model.running, before) and not buffers & set(reduced),
               "the buffer was all-reduced" if buffers & set(reduced) else "the buffer changed",
               ["average the parameters' gradients only: buffers are not gradients"])
    calls = sum(n for name, n in ctx.calls.items() if name in ("all_reduce", "reduce"))
    tied = reduced.count(model.a.weight.grad.data_ptr()) > 1  # one Parameter, one .grad
    ctx.expect(calls <= with_grad, f"{calls} all-reduces for {with_grad} gradients", [
        "model.parameters() lists the tied weight once; walking the modules' own parameters "
        "reduces it twice (the same mean, twice the traffic)"] if tied else [])


@grader.case("a gradient all zeros on rank 0 only (a dead ReLU there): still averaged")
def zero_on_one_rank(ctx):
    """A gradient all zeros on rank 0 only is still averaged with the others': every rank
    makes the same all-reduces, whatever its values."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 4), nn.Linear(4, 3)).double()
    g = torch.Generator().manual_seed(20 + ctx.rank)
    model(torch.randn(5, 6, generator=g, dtype=torch.float64)).pow(2).sum().backward()
    if ctx.rank == 0:
        model[0].bias.grad.zero_()  # as a ReLU dead on this rank's whole batch leaves it
    want = [p.grad.clone() for p in model.parameters()]
    for t in want:
        dist.all_reduce(t)  # torch's sum, outside the piece
        t /= ctx.world_size
    ctx.call(ctx.impl.average_gradients, model)
    for (name, p), w in zip(model.named_parameters(), want):
        ctx.expect_close(p.grad, w, f"{name}.grad", atol=1e-12, rtol=1e-9, hints=[
            "a gradient of zeros on one rank is still part of the mean (the others' are not "
            "zero): every rank must make the same all-reduces, whatever its values"])
