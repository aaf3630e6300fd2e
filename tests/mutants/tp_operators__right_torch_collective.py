"""Right, written another way: torch's all_reduce on a copy, the identity as a clone, each
all-reduce noted in log by hand (the entries _log would write)."""
import torch
import torch.distributed as dist


def note(log, tensor, op, pass_):
    """What _log does: one entry per all-reduce when log is a list."""
    if log is not None:
        log.append({"op": op, "pass": pass_, "bytes": tensor.nelement() * tensor.element_size()})


class CopyToParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group=None, log=None):
        ctx.group, ctx.log = group, log
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        total = grad.clone()
        dist.all_reduce(total, group=ctx.group)
        note(ctx.log, total, "f", "backward")
        return total, None, None


class ReduceFromParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group=None, log=None):
        total = x.clone()
        dist.all_reduce(total, group=group)
        note(log, total, "g", "forward")
        return total

    @staticmethod
    def backward(ctx, grad):
        return grad.clone(), None, None
