"""Sums the gradients and forgets to divide by the world size."""
import torch.distributed as dist

CAUGHT_BY = "one step of a model with frozen, unused and tied parameters"
HINT = "times too big: summed but not divided"


def average_gradients(model):
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
