"""Local SGD: every rank trains its own copy for a while, then the copies are averaged.

    local = LocalSGD(model.parameters(), period=8)          # average every 8 steps
                                                             # (or opt.param_groups)
    for x, y in loader:                                      # each rank: its own shard, no sync
        optimizer.zero_grad(); F.nll_loss(model(x), y).backward(); optimizer.step()
        local.step()                                         # all-reduce the weights, sometimes

Synchronous SGD all-reduces the gradients at every step. Local SGD (Stich 2019; Lin et al.
2020, "post-local SGD") all-reduces the *weights* only every `period` = H steps: H times
fewer bytes, at the price of copies that drift apart in between. With H = 1 and plain SGD
it is synchronous SGD exactly: averaging w - lr * g_r over the ranks is w - lr * mean(g_r);
with momentum and weight decay too, because every piece of the update is linear in g.

The schedule (torch's PeriodicModelAverager's, step for step) and DiLoCo's outer optimizer:
LocalSGD's docstring.
"""
import torch
import torch.distributed as dist

from dist_sgd.comm.flat import copy_back, flatten
from dist_sgd.plumbing.mine import swap_in
from dist_sgd.plumbing.rank import world


def average_parameters(params, group=None):
    """Replace every parameter by its mean over the ranks: one all-reduce of a flat copy."""
    # ---- exercise LocalSGD: every parameter replaced, in place, by its mean over the ranks
    params = list(params)
    flat = flatten(params)
    world_size = world(group=group)[1]
    if world_size > 1:
        dist.all_reduce(flat, group=group)
        flat /= world_size
    copy_back(flat, params)
    # ---- end of exercise


def _parameters(params):
    """Parameters, or parameter groups as opt.param_groups holds them (torch's averagers take
    both): the parameters, in order, each once."""
    out = []
    for item in params:
        out += item["params"] if isinstance(item, dict) else [item]
    return list({id(p): p for p in out}.values())


class LocalSGD:
    """Call step() after every optimizer.step(); it averages the weights every `period` steps.

    outer_lr: None for plain averaging; a number for DiLoCo's outer SGD step (with
    outer_momentum and nesterov). `syncs` counts the averages, `bytes_per_sync` is what one
    ring all-reduce of the weights sends per rank (2 (p-1)/p * n bytes).

    The schedule is torch's PeriodicModelAverager's, step for step (tests prove it): a counter
    starts at 0 and the weights are averaged when counter >= warmup_steps and
    (counter - warmup_steps) % period == 0, so the first average follows the first step.

    DiLoCo (Douillard et al. 2023) adds an *outer* optimizer: the ranks' average is not taken
    as is, but read as a gradient, outer_grad = anchor - average, where anchor is the model of
    the last sync, and the anchor takes a step of SGD with Nesterov momentum (the paper:
    outer_lr 0.7, momentum 0.9). With outer_lr = 1 and no momentum that step lands exactly on
    the average: plain local SGD again.
    """

    def __init__(self, params, period, warmup_steps=0, group=None, outer_lr=None,
                 outer_momentum=0.0, nesterov=False):
        if isinstance(period, bool) or not isinstance(period, int) or period < 1:
            raise ValueError(f"period must be a positive integer, got {period!r}")
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise ValueError(f"warmup_steps must be an integer >= 0, got {warmup_steps!r}")
        self.params = [p for p in _parameters(params) if p.requires_grad]
        self.period, self.warmup_steps, self.group = period, warmup_steps, group
        self.counter, self.syncs = 0, 0
        p, n = world(group=group)[1], sum(q.numel() * q.element_size() for q in self.params)
        self.bytes_per_sync = 2 * (p - 1) / p * n
        self.outer = None
        if outer_lr is not None:
            # The anchor: the model as of the last sync, which the outer optimizer steps.
            self.anchor = [q.detach().clone().requires_grad_(True) for q in self.params]
            self.outer = torch.optim.SGD(self.anchor, lr=outer_lr, momentum=outer_momentum,
                                         nesterov=nesterov)

    def step(self):
        """After optimizer.step(): average the weights if this step is due. True if it did."""
        # ---- exercise LocalSGD: call self.sync() on the steps torch's PeriodicModelAverager would
        due = self.counter >= self.warmup_steps and \
            (self.counter - self.warmup_steps) % self.period == 0
        if due:
            self.sync()
        self.counter += 1
        return due
        # ---- end of exercise

    @torch.no_grad()
    def sync(self):
        average_parameters(self.params, self.group)
        self.syncs += 1
        if self.outer is None:
            return
        for a, mean in zip(self.anchor, self.params):
            a.grad = a.detach() - mean  # outer gradient: how far the average moved from the anchor
        self.outer.step()
        for p, a in zip(self.params, self.anchor):  # every rank restarts from the new anchor
            p.copy_(a)


# DIST_SGD_MINE: a learner's version replaces ours
swap_in(globals(), "LocalSGD", ("average_parameters", "LocalSGD"), lesson="15")
