"""Lesson 07's BucketedDDP, step 3: complete buckets launched strictly in bucket order during
backward. Compared with torch's DistributedDataParallel (the same buckets: bit for bit) and,
with an unused layer or a communication hook, with one process on the global batch."""
import copy

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from dist_sgd.comm.ordered import start_all_reduce
from dist_sgd.course.grade import Grader

grader = Grader("bucketed_ddp", error_hints={
    "list index out of range": "stop at the last bucket: self._next < len(self.buckets) "
                               "before looking at self.buckets[self._next]",
    "'NoneType' object has no attribute 'wait'": "a bucket was never launched: keep "
                                                 "launching while the next bucket is complete"})
PER_RANK = 3
CAP = 2 / 1024  # 2 KB buckets: Net's gradients in several


class Net(nn.Module):
    """Odd sizes, a frozen layer, a tied weight and a layer used only when asked."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(11, 13)
        self.frozen = nn.Linear(13, 13).requires_grad_(False)
        self.a, self.b = nn.Linear(13, 13), nn.Linear(13, 13)
        self.b.weight = self.a.weight
        self.extra = nn.Linear(13, 13)
        self.head = nn.Linear(13, 5)

    def forward(self, x, use_extra=True):
        h = torch.tanh(self.frozen(torch.tanh(self.inp(x))))
        h = torch.tanh(self.b(torch.tanh(self.a(h))))
        if use_extra:
            h = h + torch.tanh(self.extra(h))
        return self.head(h)


def _model(seed, dtype):
    torch.manual_seed(seed)
    return Net().to(dtype)


def _batch(ctx, step, dtype):
    g = torch.Generator().manual_seed(100 + step)
    n = PER_RANK * ctx.world_size
    return torch.randn(n, 11, generator=g, dtype=dtype), torch.randint(0, 5, (n,), generator=g)


def _mine(ctx, t):
    return t[ctx.rank * PER_RANK:(ctx.rank + 1) * PER_RANK]


def _grads(model):
    return {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}


def _train(ctx, wrapped, model, steps, dtype, use_extra=lambda step: True, call=False):
    grads = []
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        x, y = _batch(ctx, step, dtype)
        opt.zero_grad()
        loss = F.cross_entropy(wrapped(_mine(ctx, x), use_extra(step)), _mine(ctx, y))
        ctx.call(loss.backward) if call else loss.backward()
        grads.append(_grads(model))
        opt.step()
    dist.barrier()  # no rank goes on while a peer's reducer is finishing
    return grads


def _one_process(ctx, steps, dtype, use_extra=lambda step: True):
    model = _model(0, dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    grads = []
    for step in range(steps):
        x, y = _batch(ctx, step, dtype)
        opt.zero_grad()
        sum(F.cross_entropy(model(x[r * PER_RANK:(r + 1) * PER_RANK], use_extra(step)),
                            y[r * PER_RANK:(r + 1) * PER_RANK])
            for r in range(ctx.world_size)).div(ctx.world_size).backward()
        grads.append(_grads(model))
        opt.step()
    return grads


def _expect(ctx, got, want, atol, rtol, hints=()):
    for step, (g, w) in enumerate(zip(got, want)):
        for name in w:
            if w[name] is None or g[name] is None:
                ctx.expect(g[name] is None and w[name] is None,
                           f"step {step}: {name}.grad is {g[name] is not None and 'set'}, "
                           f"expected {w[name] is not None and 'set'}", hints)
                continue
            ctx.expect_close(g[name], w[name], f"step {step}: {name}.grad", atol=atol,
                             rtol=rtol, hints=hints)


@grader.case("three steps in 2 KB buckets: torch DDP's gradients bit for bit")
def torchs_buckets(ctx):
    """Three steps in 2 KB buckets: the gradients when backward() returns equal torch DDP's bit
    for bit (the same buckets, reduced in the same order)."""
    model = _model(ctx.rank, torch.float32)  # ranks start apart: both take rank 0's weights
    theirs = copy.deepcopy(model)
    want = _train(ctx, TorchDDP(theirs, bucket_cap_mb=CAP), theirs, 3, torch.float32)
    mine = ctx.call(ctx.impl.BucketedDDP, model, CAP)
    got = _train(ctx, mine, model, 3, torch.float32, call=True)
    _expect(ctx, got, want, atol=0, rtol=0, hints=[
        "torch adds the same numbers in the same order only if the buckets go out in bucket "
        "order, each with the gradients times 1/p already in it"])


@grader.case("a layer no rank uses in one step: every bucket still sent, its gradient None")
def unused_layer(ctx):
    """When no rank uses a layer in a step, every bucket is still all-reduced and that layer's
    gradient stays None, the others as one process's."""
    def use_extra(step):
        return step != 1  # step 1: nobody uses it, so its buckets complete only at the end

    model = _model(ctx.rank, torch.float64)
    mine = ctx.call(ctx.impl.BucketedDDP, model, 0, rebuild_after=None)  # a bucket each
    got = _train(ctx, mine, model, 2, torch.float64, use_extra, call=True)
    want = _one_process(ctx, 2, torch.float64, use_extra)
    _expect(ctx, got, want, atol=1e-12, rtol=1e-9)


@grader.case("with a communication hook (reduce): the hook's averages")
def with_reduce(ctx):
    """With a communication hook set (self.reduce), each bucket's average is the hook's
    Future's value."""
    def reduce(bucket):  # the hook divides: the core copied the gradients unscaled
        return start_all_reduce(bucket.flat.div_(ctx.world_size))

    model = _model(ctx.rank, torch.float64)
    mine = ctx.call(ctx.impl.BucketedDDP, model, CAP, reduce=reduce)
    got = _train(ctx, mine, model, 3, torch.float64, call=True)
    want = _one_process(ctx, 3, torch.float64)
    _expect(ctx, got, want, atol=1e-12, rtol=1e-9, hints=[
        "with self.reduce set, the bucket's average is self.reduce(bucket)'s Future"])


@grader.case("a hook with two collectives; at step 1 only rank 0 uses a layer: buckets "
             "launched together, in order", world_sizes=(2, 3))
def two_collectives(ctx):
    """A hook that issues a second collective once its first is done, and a layer only rank
    0 uses at step 1: buckets launched together at the end of backward, strictly in bucket
    order, each bucket its own, the next started only once the hook's Future is done; the
    gradients of one process."""
    # A bucket per parameter. At step 1 the other ranks leave `extra` unused: there its
    # buckets complete only when backward ends, and with the buckets after them they are
    # launched in one call, while rank 0 launches them as backward goes: only bucket order
    # makes the ranks issue the same collectives in the same order. The hook issues a second
    # collective once its first is done (as PowerSGD does): the next bucket may start only
    # once this one's Future is done (in_order(..., later=True)).
    p, state = ctx.world_size, {"last": None, "early": 0, "next": 0, "wrong": []}

    def reduce(bucket):
        # What this hook is asked breaks no rank: it reduces the bucket that is next in order
        # once the one before is done, and notes what it was asked instead (noted: reported).
        if state["last"] is not None and not state["last"].done():
            state["early"] += 1
            state["last"].wait()  # the peers' collectives stay paired: ours in order too
        want = mine.buckets[state["next"]]
        if bucket is not want:
            state["wrong"].append((bucket.index, want.index))
            bucket = want
        state["next"] = (state["next"] + 1) % len(mine.buckets)
        flat, out = bucket.flat.div_(p), torch.futures.Future()

        def second(_):
            tag = torch.ones(bucket.index + 1, dtype=flat.dtype)  # a size of its own
            dist.all_reduce(tag, async_op=True).get_future().then(
                lambda _: out.set_result(flat))
        dist.all_reduce(flat, async_op=True).get_future().then(second)
        state["last"] = out
        return out

    def use_extra(step, rank=ctx.rank):
        return step != 1 or rank == 0

    model = _model(ctx.rank, torch.float64)
    mine = ctx.call(ctx.impl.BucketedDDP, model, 0, reduce=reduce, rebuild_after=None)
    got = _train(ctx, mine, model, 2, torch.float64, use_extra, call=True)
    ref = _model(0, torch.float64)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    want = []
    for step in range(2):
        x, y = _batch(ctx, step, torch.float64)
        opt.zero_grad()
        part = [slice(r * PER_RANK, (r + 1) * PER_RANK) for r in range(p)]
        sum(F.cross_entropy(ref(x[s], use_extra(step, r)), y[s])
            for r, s in enumerate(part)).div(p).backward()
        want.append(_grads(ref))
        opt.step()
    ctx.expect(not state["wrong"], "the hook was asked to reduce bucket(s) "
               f"{[w for w, _ in state['wrong']]} where {[n for _, n in state['wrong']]} "
               "came next in bucket order", [
                   "launch strictly in bucket order, each bucket its own: a lambda made in a "
                   "loop sees the loop's variable as it is when it runs (lambda b=bucket: ... "
                   "keeps this one)"])
    ctx.expect(state["early"] == 0, f"{state['early']} bucket(s) started while the bucket "
               "before was still in its hook (its Future not done)", [
                   "a communication hook may issue more collectives until its Future is done: "
                   "in_order(start, later=True), so the next bucket waits for it"])
    _expect(ctx, got, want, atol=1e-12, rtol=1e-9, hints=[
        "launch strictly in bucket order, each bucket its own: a lambda made in a loop sees "
        "the loop's variable as it is when it runs (lambda b=bucket: ... keeps this one)"])
