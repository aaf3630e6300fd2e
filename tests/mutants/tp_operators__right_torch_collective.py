"""Right, written another way: torch's all_reduce on a copy, the identity as a clone."""
import torch
import torch.distributed as dist


class CopyToParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group=None, log=None):
        ctx.group = group
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        total = grad.clone()
        dist.all_reduce(total, group=ctx.group)
        return total, None, None


class ReduceFromParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group=None, log=None):
        total = x.clone()
        dist.all_reduce(total, group=group)
        return total

    @staticmethod
    def backward(ctx, grad):
        return grad.clone(), None, None
