"""f and g swapped: f all-reduces forward, g backward. At world size 1 nothing shows; at 2
the copy is summed (doubled) and the partial sums never are."""
import torch

from dist_sgd.comm.collectives import all_reduce

CAUGHT_BY = "f: identity forward, the ranks' gradients summed backward"
HINT = ("f and g swapped? f (CopyToParallel) is the identity", "f's forward sends nothing")


class CopyToParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group=None, log=None):
        x = x.clone()
        all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


class ReduceFromParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group=None, log=None):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        all_reduce(grad, group=ctx.group)
        return grad, None, None
