"""Lesson 07's HookDDP(module), step 2: a hook on each parameter starts an asynchronous
all-reduce of its gradient as soon as autograd has it, and backward() returns only once every
one is averaged. Compared with torch's DistributedDataParallel on the same model and shards."""
import datetime
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from dist_sgd.course.grade import Grader

FROZEN_HINT = "a frozen parameter keeps .grad None: hook only the parameters that require a " \
              "gradient"
grader = Grader("hook_ddp", error_hints={
    "doesn't require gradient": FROZEN_HINT,  # torch refuses a hook on a frozen parameter
    "NoneType": "the hook runs once param.grad is accumulated: param.grad is set there (a "
                "frozen parameter has no hook at all)",
    "queue_callback": "call_when_backward_ends only works while backward runs: call it from "
                      "the hook, not from __init__ or forward"})
PER_RANK = 3
LATE = 0.15 # seconds rank 0 waits before its backward: its peers' all-reduces must wait for it


class Net(nn.Module):
    """A frozen layer (no hook, no all-reduce) and a weight tied between two layers."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(10, 8)
        self.frozen = nn.Linear(8, 8).requires_grad_(False)
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)
        self.b.weight = self.a.weight
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        h = torch.tanh(self.frozen(torch.tanh(self.inp(x))))
        return self.head(torch.tanh(self.b(torch.tanh(self.a(h)))))


def _model(ctx):
    torch.manual_seed(ctx.rank)  # ranks start apart: the wrapper takes rank 0's weights
    return Net().double()


def _shard(ctx, step):
    g = torch.Generator().manual_seed(100 * step + ctx.rank)
    return (torch.randn(PER_RANK, 10, generator=g, dtype=torch.float64),
            torch.randint(0, 4, (PER_RANK,), generator=g))


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _torch_steps(ctx, steps):
    """torch's DDP: the gradients of each step and the weights after them (SGD, momentum)."""
    model = _model(ctx)
    ddp = TorchDDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    grads = []
    for step in range(steps):
        x, y = _shard(ctx, step)
        opt.zero_grad()
        F.cross_entropy(ddp(x), y).backward()
        grads.append(_grads(model))
        opt.step()
    dist.barrier()  # no rank goes on while a peer's reducer is finishing
    return grads, {n: p.detach().clone() for n, p in model.named_parameters()}


def _mine_steps(ctx, steps):
    """The learner's HookDDP, rank 0 late to each backward; the gradients as backward()
    returns them (nothing called after it), then the weights."""
    model = _model(ctx)
    wrapped = ctx.call(ctx.impl.HookDDP, model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    grads = []
    for step in range(steps):
        x, y = _shard(ctx, step)
        opt.zero_grad()
        loss = F.cross_entropy(wrapped(x), y)
        if ctx.rank == 0:
            time.sleep(LATE)
        ctx.call(loss.backward)
        grads.append(_grads(model))  # at once: what the optimizer would see
        wrapped.finish_gradient_synchronization()  # harmless when done; lets a slow one land
        opt.step()
    dist.barrier()
    return grads, {n: p.detach().clone() for n, p in model.named_parameters()}


def _expect_grads(ctx, got, want, step):
    ctx.expect(set(got) == set(want), f"step {step}: gradients for {sorted(got)}, expected "
               f"{sorted(want)}", [FROZEN_HINT])
    for name in want:
        # p times the mean is a sum, not a wait that was missed: its own hint (the symptoms')
        summed = ctx.world_size > 1 and got[name] is not None and \
            got[name].shape == want[name].shape and \
            torch.allclose(got[name], want[name] * ctx.world_size, rtol=1e-6, atol=1e-12)
        ctx.expect_close(got[name], want[name], f"step {step}: {name}.grad when backward() "
                         "returned", atol=1e-12, rtol=1e-9, hints=[] if summed else [
                             "backward() must return with every gradient averaged: the first "
                             "hook of each backward asks call_when_backward_ends to wait for "
                             "all of them"])


@grader.case("one backward: every gradient averaged when backward() returns, rank 0 late")
def one_backward(ctx):
    """When backward() returns, every gradient is torch DDP's average (within 1e-12 + 1e-9
    relative), even with rank 0 arriving late; frozen parameters keep .grad None."""
    want, _ = _torch_steps(ctx, 1)
    got, _ = _mine_steps(ctx, 1)
    _expect_grads(ctx, got[0], want[0], 0)


@grader.case("three steps of SGD with momentum: torch DDP's gradients and weights")
def three_steps(ctx):
    """Three steps of SGD with momentum: the gradients at each step and the final weights are
    torch DDP's."""
    want, want_weights = _torch_steps(ctx, 3)
    got, weights = _mine_steps(ctx, 3)
    for step in range(3):
        _expect_grads(ctx, got[step], want[step], step)
    for name in want_weights:
        ctx.expect_close(weights[name], want_weights[name], f"{name} after 3 steps",
                         atol=1e-10, rtol=1e-8)


class _Reached(torch.autograd.Function):
    """Identity; its backward (run once backward has gone past the layers above) calls
    `reached`: how a case sees where backward is."""

    @staticmethod
    def forward(ctx, x, reached):
        ctx.reached = reached
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.reached()
        return grad, None


class _Stack(nn.Module):
    def __init__(self, reached):
        super().__init__()
        self.low, self.high, self.head = nn.Linear(6, 6), nn.Linear(6, 6), nn.Linear(6, 3)
        self.reached = reached

    def forward(self, x):
        h = _Reached.apply(torch.tanh(self.low(x)), self.reached)  # below: low's gradients
        return self.head(torch.tanh(self.high(h)))


@grader.case("overlap: rank 1's backward reaches the first layer while its first all-reduce "
             "waits for rank 0", world_sizes=(2,))
def overlap(ctx):
    """Rank 0 holds back its backward until rank 1's backward has gone past its top layers:
    a hook that starts its all-reduce and returns lets backward go on (overlap), one that
    waits for its own all-reduce stalls it."""
    # Rank 0 holds back its whole backward (so every all-reduce) until rank 1's backward has
    # gone past head's and high's gradients. A hook that starts its all-reduce and returns
    # lets rank 1 get there; one that waits for its own all-reduce stalls rank 1's backward
    # at the first gradient, for as long as rank 0 holds back. Proven by the order of
    # events; the wait below only bounds the failure.
    store = dist.distributed_c10d._get_default_store()
    reached = lambda: store.set("hook_ddp_overlap", "1") if ctx.rank == 1 else None  # noqa
    torch.manual_seed(0)
    model = _Stack(reached).double()
    wrapped = ctx.call(ctx.impl.HookDDP, model)
    x = torch.randn(4, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(ctx.rank))
    loss = wrapped(x).square().sum()
    stalled = False
    if ctx.rank == 0:
        try:
            store.wait(["hook_ddp_overlap"], datetime.timedelta(
                seconds=min(5.0, ctx.patience / 2)))
        except Exception:  # noqa: BLE001 - rank 1 never got there
            stalled = True
    ctx.call(loss.backward)
    wrapped.finish_gradient_synchronization()
    dist.barrier()
    ctx.expect(not stalled, "rank 1's backward stalled at its first gradient while its "
               "all-reduce waited for rank 0: the hook waited for its own all-reduce, so "
               "backward and communication never overlap", [
                   "start the all-reduce asynchronously and return at once (keep its Future); "
                   "wait for all of them only when backward ends "
                   "(call_when_backward_ends(self.finish_gradient_synchronization))"])
