"""A correct version written without the library's helpers: torch's post-accumulate hooks,
dist.all_reduce(async_op=True) and the autograd engine's queue_callback to wait at the end."""
import torch
import torch.distributed as dist
import torch.nn as nn


class HookDDP(nn.Module):
    def __init__(self, module, all_reduce=None):
        super().__init__()
        self.module = module
        with torch.no_grad():
            for p in module.parameters():
                dist.broadcast(p, 0)
        self._works = []
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._grad_ready)

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    def _grad_ready(self, param):
        if not self._works:
            torch.autograd.Variable._execution_engine.queue_callback(
                self.finish_gradient_synchronization)
        param.grad /= dist.get_world_size()
        self._works.append(dist.all_reduce(param.grad, async_op=True))

    def finish_gradient_synchronization(self):
        for work in self._works:
            work.wait()
        self._works = []
