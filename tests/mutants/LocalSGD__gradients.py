"""Averages the gradients instead of the weights: after optimizer.step() they are spent,
so the copies never meet again (synchronous SGD averages gradients *before* the step)."""
import torch
import torch.distributed as dist

CAUGHT_BY = "period 3, 7 steps: torch's PeriodicModelAverager's weights on every rank"
HINT = "average the weights (after optimizer.step()),"


def average_parameters(params, group=None):
    params = list(params)
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    dist.all_reduce(flat, group=group)
    flat /= dist.get_world_size(group)
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()


class LocalSGD:
    def __init__(self, params, period, warmup_steps=0, group=None):
        self.params = [p for p in params if p.requires_grad]
        self.period, self.warmup_steps, self.group = period, warmup_steps, group
        self.counter, self.syncs = 0, 0

    def step(self):
        due = self.counter >= self.warmup_steps and \
            (self.counter - self.warmup_steps) % self.period == 0
        if due:
            self.sync()
        self.counter += 1
        return due

    @torch.no_grad()
    def sync(self):
        for p in self.params:
            dist.all_reduce(p.grad, group=self.group)
            p.grad /= dist.get_world_size(self.group)
        self.syncs += 1
