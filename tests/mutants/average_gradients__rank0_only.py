"""Reduces to rank 0 (dist.reduce) and never sends the result back: only rank 0 averages."""
import torch.distributed as dist

CAUGHT_BY = "one step of a model with frozen, unused and tied parameters"


def average_gradients(model):
    for p in model.parameters():
        if p.grad is not None:
            dist.reduce(p.grad, dst=0)
            p.grad /= dist.get_world_size()
