"""Lesson 15's local SGD: every rank trains its own copy, LocalSGD.step() after each optimizer
step averages the weights every `period` steps (after warmup_steps), as torch's
PeriodicModelAverager does; with period 1 that is all-reduce SGD. Each rank's weights after
the steps are compared with torch's on the same rank, in float64 (within 1e-12: the mean's
rounding depends on where the division happens)."""

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager

from dist_sgd.course.grade import Grader

grader = Grader("LocalSGD", error_hints={
    "NoneType": "average the parameters themselves (p.data or p under torch.no_grad()), "
                "not their .grad",
    "a leaf Variable that requires grad": "change the parameters under torch.no_grad() (or "
                                          "through p.data): averaging is not part of the graph"})
ATOL = RTOL = 1e-12
HINTS = {
    "schedule": "the call number c = 0, 1, 2, ... of step() averages when c >= warmup_steps and "
                "(c - warmup_steps) % period == 0: the first call averages, then every period-th",
    "params": "average the weights (after optimizer.step()), not the gradients",
    "warmup": "no averaging during the first warmup_steps calls of step(); the next call "
              "averages, then every period-th",
}


def _model():
    torch.manual_seed(0)  # the same start on every rank
    return nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3)).double()


def _batch(rank, step):
    g = torch.Generator().manual_seed(1000 * rank + step)  # every rank its own data
    return torch.randn(6, 5, generator=g, dtype=torch.float64), torch.randint(0, 3, (6,),
                                                                             generator=g)


def _train(ctx, model, steps, after_step, sync_gradients=False):
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    for step in range(steps):
        x, y = _batch(ctx.rank, step)
        opt.zero_grad()
        F.nll_loss(F.log_softmax(model(x), dim=1), y).backward()
        if sync_gradients:  # all-reduce SGD: the mean gradient on every rank
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= ctx.world_size
        opt.step()
        after_step()


def _against_torch(ctx, steps, period, warmup_steps=0, schedule_hint=HINTS["schedule"]):
    """Ours and torch's on this rank after `steps` steps: how often each averaged (ours:
    local.syncs, which the lesson reads), then the weights."""
    ref, mine = _model(), _model()
    averager = PeriodicModelAverager(period=period, warmup_steps=warmup_steps)
    _train(ctx, ref, steps, lambda: averager.average_parameters(ref.parameters()))
    local = ctx.call(ctx.impl.LocalSGD, mine.parameters(), period=period,
                     warmup_steps=warmup_steps)
    _train(ctx, mine, steps, lambda: ctx.call(local.step))
    due = [c for c in range(steps) if c >= warmup_steps and (c - warmup_steps) % period == 0]
    syncs = getattr(local, "syncs", None)
    ctx.expect(syncs == len(due), f"averaged {syncs} times in {steps} steps (local.syncs), "
               f"expected {len(due)}: after steps {', '.join(map(str, due))}",
               [schedule_hint] if syncs else ["average through self.sync(): it counts "
                                              "self.syncs, which the lesson reads"])
    for (name, p), q in zip(mine.named_parameters(), ref.parameters()):
        ctx.expect_close(p.detach(), q.detach(), f"{name} after {steps} steps", atol=ATOL,
                         rtol=RTOL, hints=[HINTS["params"]])


class _Once:
    """The parameters as model.parameters() gives them: an iterator, read once; `ends` counts
    the reads that ran into its end (2 or more: the piece read it again, and found nothing)."""

    def __init__(self, items):
        self.items, self.ends = iter(items), 0

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return next(self.items)
        except StopIteration:
            self.ends += 1
            raise


@grader.case("average_parameters: every parameter becomes the ranks' mean, in place")
def mean(ctx):
    """Average_parameters replaces every parameter, in place, by its mean over the ranks
    (float64, within 1e-12)."""
    params = [torch.nn.Parameter(torch.randn(shape, dtype=torch.float64,
                                             generator=torch.Generator().manual_seed(ctx.rank)))
              for shape in ((3, 5), (7,), (1,))]
    every = [torch.stack(ctx.everyone(p.detach().clone())) for p in params]  # before the call
    own = [p.detach().clone() for p in params]
    # As model.parameters() gives them (torch's averagers take it): an iterator, read once.
    once = _Once(params)
    ctx.call(ctx.impl.average_parameters, once)
    for i, (p, ranks) in enumerate(zip(params, every)):
        ctx.expect_close(p.detach(), ranks.mean(0), f"parameter {i}", atol=ATOL, rtol=RTOL,
                         own=own[i] if ctx.world_size > 1 else None, hints=[
                             "params may be a generator (model.parameters()): it can be read "
                             "once only, so make it a list first"] if once.ends > 1 else [])


@grader.case("period 1, 4 steps: all-reduce SGD's weights")
def period_one(ctx):
    """Averaging the weights after every step gives all-reduce SGD's weights."""
    ref, mine = _model(), _model()
    _train(ctx, ref, 4, lambda: None, sync_gradients=True)
    local = ctx.call(ctx.impl.LocalSGD, mine.parameters(), period=1)
    _train(ctx, mine, 4, lambda: ctx.call(local.step))
    for (name, p), q in zip(mine.named_parameters(), ref.parameters()):
        ctx.expect_close(p.detach(), q.detach(), f"{name} after 4 steps", atol=ATOL, rtol=RTOL,
                         hints=[HINTS["params"], HINTS["schedule"]])


@grader.case("period 3, 7 steps: torch's PeriodicModelAverager's weights on every rank")
def period_three(ctx):
    """Step() averages after steps 0, 3, 6 (local.syncs counts them) and the weights equal
    torch's PeriodicModelAverager's on every rank."""
    _against_torch(ctx, 7, 3)


@grader.case("period 2 after warmup_steps 3, 8 steps: torch's weights on every rank")
def warmup(ctx):
    """The same after warmup_steps: no averaging during the first 3 calls, then every period-
    th."""
    _against_torch(ctx, 8, 2, warmup_steps=3, schedule_hint=HINTS["warmup"])
