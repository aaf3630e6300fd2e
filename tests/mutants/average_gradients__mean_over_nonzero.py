"""Averages each gradient over the ranks whose gradient is not all zeros (counted with a second
all-reduce), reading a zero gradient as a rank that had nothing to say. But the loss is the mean
over the global batch: a rank whose batch gives a zero gradient (a ReLU dead there) still counts
its share, so the sum is divided by the world size, whatever the values."""
import torch
import torch.distributed as dist

CAUGHT_BY = "a gradient all zeros on rank 0 only (a dead ReLU there): still averaged"
HINT = "a gradient of zeros on one rank is still part of the mean"


def average_gradients(model):
    for p in model.parameters():
        if p.grad is None:
            continue
        count = torch.tensor([1.0 if p.grad.any() else 0.0])
        dist.all_reduce(count, op=dist.ReduceOp.SUM)
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
        p.grad /= count.item()
