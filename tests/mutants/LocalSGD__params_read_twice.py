"""Reads params twice: once to flatten, once to copy back. torch's averagers take
model.parameters(), a generator: the first pass empties it, the copy back finds nothing,
and the weights never change. Make it a list first."""
import torch
import torch.distributed as dist
from dist_sgd.comm.flat import copy_back, flatten
from dist_sgd.plumbing.rank import world
from dist_sgd.beyond.local_sgd import _parameters


CAUGHT_BY = "average_parameters: every parameter becomes the ranks' mean, in place"
HINT = ("this rank still holds its own values", "params may be a generator")


def average_parameters(params, group=None):
    """Replace every parameter by its mean over the ranks: one all-reduce of a flat copy."""
    flat = flatten(params)
    dist.all_reduce(flat, group=group)
    flat /= world(group=group)[1]
    copy_back(flat, params)


class LocalSGD:
    """Call step() after every optimizer.step(); it averages the weights every `period` steps.

    outer_lr: None for plain averaging; a number for DiLoCo's outer SGD step (with
    outer_momentum and nesterov). `syncs` counts the averages, `bytes_per_sync` is what one
    ring all-reduce of the weights sends per rank (2 (p-1)/p * n bytes).
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
        due = self.counter >= self.warmup_steps and \
            (self.counter - self.warmup_steps) % self.period == 0
        if due:
            self.sync()
        self.counter += 1
        return due

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
