"""Starts the all-reduce, then waits for it inside the hook: the gradients come out right,
but autograd cannot compute the next layer's gradient until this one's all-reduce is done,
so every hook stalls backward for a whole all-reduce and nothing overlaps. The hook must
return at once and leave the waiting to the end of backward."""
import time
import torch.distributed as dist
import torch.nn as nn
from dist_sgd.comm.ordered import start_all_reduce
from dist_sgd.ddp.hooks import call_when_backward_ends, hook_gradients
from dist_sgd.sgd.sync import broadcast_parameters


CAUGHT_BY = "overlap: rank 1's backward reaches the first layer while its first all-reduce waits for rank 0"
HINT = "start the all-reduce asynchronously and return at once"


class HookDDP(nn.Module):
    """Step 2: one asynchronous all-reduce per parameter, launched by its gradient hook."""

    def __init__(self, module, all_reduce=None):
        super().__init__()
        self.module, self.all_reduce = module, all_reduce
        self.world_size = dist.get_world_size()
        self.trace = None  # a list -> event records, as DistributedDataParallel's
        broadcast_parameters(module, src=0)
        self._names = {p: n for n, p in module.named_parameters()}
        self._futures = []  # the all-reduces in flight
        self._hooks = hook_gradients([p for p in module.parameters() if p.requires_grad],
                                     self._grad_ready)

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    def _grad_ready(self, param):
        """Autograd accumulated param.grad: start averaging it at once."""
        name = self._names[param]
        self._record("hook", param=name)
        if not self._futures:
            call_when_backward_ends(self.finish_gradient_synchronization)
        param.grad.div_(self.world_size)
        future = start_all_reduce(param.grad, self.all_reduce)
        future.wait()
        self._record("launch", param=name)
        if self.trace is not None:
            future = future.then(lambda f: (self._record("done", param=name), f.value())[1])
        self._futures.append(future)

    def finish_gradient_synchronization(self):
        for future in self._futures:
            future.wait()
        self._futures = []

    def _record(self, event, **fields):
        if self.trace is not None:
            self.trace.append(dict(event=event, t=time.perf_counter(), **fields))
