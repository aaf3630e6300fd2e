"""Walks the modules and their own parameters: the weight tied between two layers is
reduced (and divided) twice."""
import torch.distributed as dist

CAUGHT_BY = "the tied weight reduced once, the buffer left alone"
HINT = "model.parameters() lists the tied weight once;"


def average_gradients(model):
    size = dist.get_world_size()
    for module in model.modules():
        for p in module.parameters(recurse=False):
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= size
