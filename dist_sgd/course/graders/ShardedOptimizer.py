"""Lesson 13's ShardedOptimizer(params, optimizer_class, **options), ZeRO stage 1: each rank
steps only its shard of the parameters, so it holds that shard's optimizer state only, then
every parameter comes from its owner. Against torch.optim.Adam on one process over the
global batch: the same weights on every rank after several steps, with an odd number of
parameters (and a frozen one) over 1-4 ranks; every parameter's state on exactly one rank."""
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from dist_sgd.course.grade import Grader

grader = Grader("ShardedOptimizer", error_hints={
    "invalid root rank": "broadcast(p, src=r): r is the rank that owns p (the one that stepped "
                         "it)"})
PER_RANK, STEPS, LR = 3, 3, 0.05


class Model(nn.Module):
    """Five trainable parameters of five sizes (35, 5, 15, 3, 6) and a frozen layer."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(7, 5), nn.Linear(5, 3)
        self.frozen = nn.Linear(3, 3).requires_grad_(False)
        self.head = nn.Linear(3, 2, bias=False)

    def forward(self, x):
        return self.head(self.frozen(torch.tanh(self.fc2(torch.tanh(self.fc1(x))))))


def _batch(ctx, step):
    g = torch.Generator().manual_seed(50 + step)
    n = PER_RANK * ctx.world_size
    return torch.randn(n, 7, generator=g, dtype=torch.float64), \
        torch.randn(n, 2, generator=g, dtype=torch.float64)


def _train(ctx, groups=lambda model: model.parameters()):
    """(plain Adam's model on the global batch, ours on this rank's part, our optimizer).
    groups(model): the params argument, the parameters or parameter groups."""
    torch.manual_seed(0)
    plain = Model().double()
    mine = copy.deepcopy(plain)
    opt_plain = torch.optim.Adam(groups(plain), lr=LR)
    opt = ctx.call(ctx.impl.ShardedOptimizer, groups(mine), torch.optim.Adam, lr=LR)
    part = slice(ctx.rank * PER_RANK, (ctx.rank + 1) * PER_RANK)
    for step in range(STEPS):
        x, y = _batch(ctx, step)
        opt_plain.zero_grad()
        F.mse_loss(plain(x), y).backward()
        opt_plain.step()
        opt.zero_grad()
        F.mse_loss(mine(x[part]), y[part]).backward()
        ctx.call(opt.step)
    return plain, mine, opt


def _expect_plain(ctx, plain, mine, hints=()):
    for (name, p), q in zip(mine.named_parameters(), plain.parameters()):
        ctx.expect_close(p.detach(), q.detach(), f"{name} after {STEPS} steps", atol=1e-9,
                         rtol=1e-7, hints=list(hints) or [
                             "after its own step, each parameter must reach every rank from "
                             "its owner (the one rank that stepped it): broadcast(p, src=owner)",
                             "every gradient is averaged over the ranks before the step"])


@grader.case("3 Adam steps: plain Adam's weights on one process, on every rank")
def like_plain_adam(ctx):
    """Three steps of the sharded Adam give plain Adam's weights on one process (within 1e-9 +
    1e-7 relative), the same on every rank."""
    plain, mine, _ = _train(ctx)
    weights = torch.cat([p.detach().flatten() for p in mine.parameters()])
    same = ctx.everyone(weights)
    agree = all(torch.equal(w, same[0]) for w in same)
    # The evidence picks the hint: ranks that disagree missed a broadcast; ranks that agree on
    # other weights than one process's stepped on something else than the averaged gradient.
    hint = "the ranks agree, but not with one process: each parameter is stepped by its " \
        "owner, on the gradient averaged over the ranks, and broadcast from that same owner" \
        if agree else \
        "after its own step, each parameter must reach every rank from its owner (the one " \
        "rank that stepped it): broadcast(p, src=owner)"
    for (name, p), q in zip(mine.named_parameters(), plain.parameters()):
        ctx.expect_close(p.detach(), q.detach(), f"{name} after {STEPS} steps", atol=1e-9,
                         rtol=1e-7, hints=[hint])
    # Reached only where this rank matches one process and another does not (bit for bit):
    # the disagreement's hint, as above.
    differ = [r for r, w in enumerate(same) if not torch.equal(w, same[0])]
    ctx.expect(not differ, f"ranks {differ} hold other weights than rank 0", [hint])


@grader.case("the Adam state: each parameter's on one rank only (1/p of it per rank)")
def state_sharded(ctx):
    """Each parameter's Adam state lives on exactly one rank: every rank holds about 1/p of it."""
    _, mine, opt = _train(ctx)
    index = {id(p): i for i, p in enumerate(mine.parameters())}
    held = sorted(index[id(p)] for p, s in opt.state.items() if s)
    values = sum(t.numel() for s in opt.state.values() for t in s.values()
                 if torch.is_tensor(t) and t.dim() > 0)
    every = ctx.everyone(held)
    trainable = [i for i, p in enumerate(mine.parameters()) if p.requires_grad]
    total = sum(p.numel() for p in mine.parameters() if p.requires_grad)
    holders = {}
    for r, h in enumerate(every):
        for i in h:
            holders.setdefault(i, []).append(r)
    twice = sorted(i for i, ranks in holders.items() if len(ranks) > 1)
    ctx.expect(not twice, f"this rank holds Adam state for {len(held)} of {len(trainable)} "
               f"parameters ({values:,} values, for {total:,} parameter values): parameters "
               f"{twice} have state on more than one rank", [
                   "the wrapped optimizer must be built over this rank's shard only: ZeRO-1's "
                   "saving is that each rank keeps 1/p of the state"])
    missing = sorted(set(trainable) - set(holders))
    ctx.expect(not missing, f"parameters {missing} have Adam state on no rank",
               ["every trainable parameter belongs to one rank's shard"])


@grader.case("two parameter groups with their own lr and weight decay: plain Adam's weights")
def groups(ctx):
    """Two parameter groups, the second with its own lr and weight decay: plain Adam's
    weights after 3 steps (the wrapped optimizer keeps each group's options for this rank's
    part of it)."""
    def split(model):
        return [{"params": model.fc1.parameters()},
                {"params": [*model.fc2.parameters(), *model.frozen.parameters(),
                            *model.head.parameters()], "lr": 0.02, "weight_decay": 0.1}]
    plain, mine, _ = _train(ctx, split)
    _expect_plain(ctx, plain, mine, hints=[
        "the wrapped optimizer needs this rank's part of each parameter group, with the "
        "group's own options: one local group per group (self._local_group(group, owners))"])
