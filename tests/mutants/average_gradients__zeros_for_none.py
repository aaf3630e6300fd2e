"""Gives a parameter with no gradient (frozen, or unused in this forward pass) a gradient of
zeros before averaging, so that every rank makes the same all-reduces. But torch leaves such a
.grad None, and an optimizer skips a None gradient while it steps a zero one (weight decay and
momentum still move it): the frozen weight would train. Skip a None .grad, as one process
does."""
import torch
import torch.distributed as dist

CAUGHT_BY = "one step of a model with frozen, unused and tied parameters"
HINT = "a frozen or unused parameter has no gradient: leave its .grad None"


def average_gradients(model):
    world_size = dist.get_world_size()
    for p in model.parameters():
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
        p.grad /= world_size
