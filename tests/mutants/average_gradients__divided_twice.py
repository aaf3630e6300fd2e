"""Averages with ReduceOp.AVG and divides again (as when average_gradients runs on top of a
DDP, which already averaged: pytorch/tutorials#2305)."""
import torch.distributed as dist

CAUGHT_BY = "one step of a model with frozen, unused and tied parameters"
HINT = "times too small: divided twice"


def average_gradients(model):
    size = float(dist.get_world_size())
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
            p.grad /= size
