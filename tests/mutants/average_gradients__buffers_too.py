"""Averages the buffers too, to keep the replicas alike: but a buffer is no gradient, and the
call's contract is the gradients only. A running statistic is each rank's own (its own
batches'); whether to synchronize it is the model's choice (SyncBatchNorm, DDP's
broadcast_buffers), never a side effect of averaging the gradients."""
import torch.distributed as dist

CAUGHT_BY = "the tied weight reduced once, the buffer left alone"
HINT = "average the parameters' gradients only: buffers are not gradients"


def average_gradients(model):
    world_size = dist.get_world_size()
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad /= world_size
    for b in model.buffers():
        dist.all_reduce(b, op=dist.ReduceOp.SUM)
        b /= world_size
