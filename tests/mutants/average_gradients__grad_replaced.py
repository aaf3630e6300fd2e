"""Divides with p.grad = p.grad / world_size: the values are the mean, but .grad is now a new
tensor, and whatever held the old one (an optimizer's view of the gradients, a DDP bucket
viewing them, a hook) still sees the sum. The average is in place: p.grad /= world_size."""
import torch.distributed as dist

CAUGHT_BY = "one step of a model with frozen, unused and tied parameters"
HINT = "p.grad = p.grad / p makes a new tensor"


def average_gradients(model, flat=False, all_reduce=None):
    world_size = dist.get_world_size()
    for p in model.parameters():
        if p.grad is None:
            continue
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
        p.grad = p.grad / world_size
