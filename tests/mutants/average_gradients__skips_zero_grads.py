"""Skips a gradient that is all zeros, to save sending it: but a zero gradient on one rank is
still part of the mean when the others' are not (a ReLU dead on this rank's batch), and the
ranks then make different numbers of all-reduces, which pair with the wrong tensors (wrong
sums, or a wait forever). Every rank must make the same calls, whatever its values."""
import torch.distributed as dist

CAUGHT_BY = "a gradient all zeros on rank 0 only (a dead ReLU there): still averaged"
HINT = "disagree on a message's size"


def average_gradients(model, flat=False, all_reduce=None):
    world_size = dist.get_world_size()
    for p in model.parameters():
        if p.grad is None or not p.grad.any():
            continue
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
        p.grad /= world_size
