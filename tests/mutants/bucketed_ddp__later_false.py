"""Launches every bucket with in_order(start, later=False), the hook's too: later=False
promises that start issues all its collectives before it returns, but a communication hook
may issue more from a callback (PowerSGD: P, then Q). The next bucket then starts while the
hook is still issuing, and the ranks issue their collectives in different orders (gloo
pairs messages of different sizes: it aborts, or sums the wrong tensors). A hook's bucket
goes with later=True."""
import torch
import torch.distributed as dist
import torch.nn as nn
from dist_sgd.comm.flat import views
from dist_sgd.comm.ordered import in_order
from dist_sgd.ddp.hooks import call_when_backward_ends, hook_gradients
from dist_sgd.plumbing.rank import world
from dist_sgd.sgd.sync import broadcast_parameters
from dist_sgd.ddp.bucketed import Bucket, MiB, _all_reduce, assign_buckets


CAUGHT_BY = "a hook with two collectives; at step 1 only rank 0 uses a layer: buckets launched together, in order"
HINT = "in_order(start, later=True), so the next bucket"


class BucketedDDP(nn.Module):
    """Gradients averaged over ranks, in buckets, during backward; see the module docstring."""

    def __init__(self, module, bucket_cap_mb=None, reduce=None, on_event=None,
                 rebuild_after=1, init_sync=True):
        super().__init__()
        _, self.world_size = world("DistributedDataParallel")
        self.module, self.reduce, self.on_event, self.sync = module, reduce, on_event, True
        if init_sync:  # everyone starts from rank 0's weights (False: the caller promises it)
            broadcast_parameters(module, src=0)
        # named_parameters() yields a tied (shared) Parameter once: it is reduced once.
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        if not named:
            raise RuntimeError("DistributedDataParallel is not needed when a module doesn't "
                               "have any parameter that requires a gradient.")  # torch's words
        self._params, self._names = [p for _, p in named], {p: n for n, p in named}
        self._index = {p: i for i, p in enumerate(self._params)}
        cap = (25 if bucket_cap_mb is None else bucket_cap_mb) * MiB
        self._caps = [dist._DEFAULT_FIRST_BUCKET_BYTES if bucket_cap_mb is None else cap, cap]
        # Synchronized backward passes until the rebuild (None: never, the first layout stays).
        self._rebuild_in = rebuild_after
        groups = assign_buckets(self._params, self._caps if rebuild_after is None
                                else [float("inf")])
        self._build(self._params, sorted(groups, key=min)[::-1])  # as torch: last layers first
        self._used, self._order, self._next, self._counts = set(), [], 0, None
        self._hooks = hook_gradients(self._params, self._grad_ready)

    def _build(self, order, groups):
        self.buckets = [Bucket(i, [order[j] for j in g], [self._names[order[j]] for j in g])
                        for i, g in enumerate(groups)]
        self._slot = {p: (b, j) for b in self.buckets for j, p in enumerate(b.params)}

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    def _event(self, event, **fields):
        if self.on_event is not None:
            self.on_event(event, **fields)

    def _grad_ready(self, param):
        """Autograd accumulated param.grad: put it in its bucket; launch what is complete."""
        self._used.add(param)  # used inside no_sync counts too (torch: it was accumulated)
        if not self.sync:
            return
        if not self._order:  # the first gradient of this backward: finish at its end
            call_when_backward_ends(self.finish_gradient_synchronization)
        bucket, j = self._slot[param]
        self._event("hook", bucket=bucket.index, param=bucket.names[j])
        self._fill(bucket, j, param.grad)
        self._launch_complete_buckets()

    def _fill(self, bucket, j, grad):
        if bucket.ready[j]:
            raise RuntimeError(f"gradient of {bucket.names[j]} became ready twice in one "
                               "backward pass (reentrant backward, checkpointing?): not supported")
        if grad is None:
            bucket.views[j].zero_()
        elif self.reduce is None:  # times 1/p while copying, as torch's reducer: the same bits
            torch.mul(grad, 1 / self.world_size, out=bucket.views[j])
        else:
            bucket.views[j].copy_(grad)
        bucket.ready[j] = True
        self._order.append(bucket.params[j])

    def _launch_complete_buckets(self):
        """Launch the complete buckets from self._next on, strictly in bucket order."""
        launched = self._next
        while self._next < len(self.buckets) and all(self.buckets[self._next].ready):
            bucket = self.buckets[self._next]
            if self.reduce is not None:
                bucket.future = in_order(lambda b=bucket: self.reduce(b), later=False)
            else:
                bucket.future = in_order(lambda b=bucket: _all_reduce(b.flat), later=False)
            self._next += 1
        for bucket in self.buckets[launched:self._next]:
            self._event("launch", bucket=bucket.index)
            if self.on_event is not None:  # chained: recorded before wait() returns
                bucket.future = bucket.future.then(
                    lambda f, i=bucket.index: (self._event("done", bucket=i), f.value())[1])
        if self._next == len(self.buckets) and self._counts is None:
            used = self.buckets[0].flat.new_tensor([p in self._used for p in self._params])
            self._counts = in_order(lambda: _all_reduce(used), later=False)

    def finish_gradient_synchronization(self):
        """Flush, wait for every bucket and write the averages into .grad. Autograd's engine
        calls it when backward ends; calling it again (before opt.step()) is harmless."""
        if not self._order:
            return
        try:
            self._event("flush")
            for bucket in self.buckets[self._next:]:  # not complete: unused parameters
                for j, p in enumerate(bucket.params):
                    if not bucket.ready[j]:
                        self._fill(bucket, j, p.grad)
            self._launch_complete_buckets()
            used = dict(zip(self._params, self._counts.wait().tolist()))
            for bucket in self.buckets:
                for p, mean in zip(bucket.params, views(bucket.future.wait(), bucket.params)):
                    if used[p] and p.grad is None:
                        p.grad = mean.clone()  # a copy: the bucket is reused next step
                    elif used[p]:
                        p.grad.copy_(mean)
            if self._rebuild_in is not None:
                self._rebuild_in -= 1
                if self._rebuild_in == 0:
                    self._rebuild()
        finally:
            for bucket in self.buckets:
                bucket.ready, bucket.future = [False] * len(bucket.params), None
            self._used, self._order, self._next, self._counts = set(), [], 0, None
        self._event("synchronized")

    def _rebuild(self):
        """Buckets in the order rank 0's gradients became ready (torch's rebuild_buckets)."""
        order = torch.tensor([self._index[p] for p in self._order],
                             device=self.buckets[0].flat.device)
        in_order(lambda: dist.broadcast(order, 0, async_op=True).get_future(), False).wait()
        params = [self._params[i] for i in order.tolist()]
        self._build(params, assign_buckets(params, self._caps))
        self._rebuild_in = None

    def remove_hooks(self):
        """Detach this wrapper from the module's parameters (to wrap the module again)."""
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
