"""Averages into new tensors (p = mean inside the loop): the parameters the optimizer holds
never change."""
import torch
import torch.distributed as dist

CAUGHT_BY = "average_parameters: every parameter becomes the ranks' mean, in place"
HINT = "this rank still holds its own values"


def average_parameters(params, group=None):
    params = list(params)
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    dist.all_reduce(flat, group=group)
    flat /= dist.get_world_size(group)
    offset = 0
    for p in params:
        p = flat[offset:offset + p.numel()].view_as(p)
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
        average_parameters(self.params, self.group)
        self.syncs += 1
