"""Counts the step first and averages when the count divides by the period: after steps
period, 2 period, ..., where torch averages after the first step and every period-th after."""
import torch
import torch.distributed as dist

CAUGHT_BY = "period 3, 7 steps: torch's PeriodicModelAverager's weights on every rank"
HINT = "the call number c = 0, 1, 2, ... of step()"


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
        self.counter += 1
        due = self.counter > self.warmup_steps and \
            (self.counter - self.warmup_steps) % self.period == 0
        if due:
            self.sync()
        return due

    @torch.no_grad()
    def sync(self):
        average_parameters(self.params, self.group)
        self.syncs += 1
