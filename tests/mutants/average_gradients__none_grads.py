"""The tutorial's loop as written: every parameter's .grad, also the frozen and unused ones
whose .grad is None."""
import torch.distributed as dist

CAUGHT_BY = "one step of a model with frozen, unused and tied parameters"
HINT = "a parameter whose .grad is None (frozen, or not"


def average_gradients(model):
    size = float(dist.get_world_size())
    for param in model.parameters():
        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)
        param.grad /= size
