"""The two steps on the way to DistributedDataParallel (lesson 07 diffs them).

All three wrappers are used the same way, so the training loop never changes:

    model = Wrapper(Net())            # NaiveDDP, HookDDP or bucketed.BucketedDDP
    loss.backward()
    model.finish_gradient_synchronization()   # step 1 does all its work here; 2 and 3 are done
    opt.step()

Step 1, NaiveDDP: wait for the whole backward, then average_gradients. Step 2, HookDDP: a
hook on every parameter launches its all-reduce as soon as its gradient is ready, so the
network works while backward goes on. Step 3, the core BucketedDDP (dist_sgd/ddp/bucketed.py):
the same hooks, gradients packed into buckets in torch's layout. What each step costs, and why
the next: NaiveDDP's and HookDDP's docstrings.
"""
import time

import torch.distributed as dist
import torch.nn as nn

from dist_sgd.comm.ordered import start_all_reduce
from dist_sgd.ddp.hooks import call_when_backward_ends, hook_gradients
from dist_sgd.plumbing.mine import swap_in
from dist_sgd.sgd.sync import average_gradients, broadcast_parameters


class NaiveDDP(nn.Module):
    """Step 1: broadcast at construction; average_gradients after backward, when asked.

    Step 1, NaiveDDP: wait for the whole backward, then average_gradients (lesson 06): the network
    sits idle while gradients are computed, then the CPU sits idle while they travel.
    """

    def __init__(self, module, all_reduce=None, flat=False):
        super().__init__()
        self.module, self.all_reduce, self.flat = module, all_reduce, flat
        broadcast_parameters(module, src=0)  # every rank starts from rank 0's weights

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    def finish_gradient_synchronization(self):
        average_gradients(self.module, flat=self.flat, all_reduce=self.all_reduce)


class HookDDP(nn.Module):
    """Step 2: one asynchronous all-reduce per parameter, launched by its gradient hook.

    Step 2, HookDDP adds one idea: a hook on every parameter launches an asynchronous all-reduce
    of its gradient as soon as autograd has accumulated it, so the last layer's gradient travels
    while earlier layers' gradients are still being computed. One message per parameter, though:
    many small messages each pay the network's start-up latency. And it assumes every rank
    produces every gradient, in the same order: a parameter unused on one rank only makes the
    ranks pair up different all-reduces (an error, or a hang until the timeout).
    Step 3, the core BucketedDDP (dist_sgd/ddp/bucketed.py): the same hooks, but gradients are
    packed into buckets in torch's layout, launched strictly in bucket order, and unused parameters
    are flushed at the end of backward: fewer, larger messages, still overlapped, and no hang.
    (dist_sgd.ddp.ddp.DistributedDataParallel puts torch's interface around that core.)
    """

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
        # ---- exercise hook_ddp: start averaging param.grad asynchronously; backward waits for it
        if not self._futures:  # first gradient of this backward: wait for all at its end
            call_when_backward_ends(self.finish_gradient_synchronization)
        param.grad.div_(self.world_size)  # SUM of grad / world_size = the average
        future = start_all_reduce(param.grad, self.all_reduce)
        # ---- end of exercise
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


# DIST_SGD_MINE: a learner's version replaces ours
swap_in(globals(), "hook_ddp", ("HookDDP",), lesson="07")
