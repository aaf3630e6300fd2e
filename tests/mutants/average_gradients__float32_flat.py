"""One all-reduce of a flat buffer made with torch.zeros(total): float32 (the default dtype)
whatever the gradients' dtype, so float64 gradients come back rounded to 7 digits. The
buffer takes the gradients' dtype (torch.cat of them, or zeros(..., dtype=g.dtype))."""
import torch
import torch.distributed as dist

CAUGHT_BY = "one step of a model with frozen, unused and tied parameters"


def average_gradients(model, flat=False, all_reduce=None):
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    buffer = torch.zeros(sum(g.numel() for g in grads))
    at = 0
    for g in grads:
        buffer[at:at + g.numel()] = g.flatten()
        at += g.numel()
    dist.all_reduce(buffer, op=dist.ReduceOp.SUM)
    buffer /= dist.get_world_size()
    at = 0
    for g in grads:
        g.copy_(buffer[at:at + g.numel()].view_as(g))
        at += g.numel()
