"""Step 3 of lesson 07: DDP with buckets, the whole idea in one class (after steps.py's 1 and 2).

    model = BucketedDDP(Net())             # inside a process group: everyone takes rank 0's weights
    F.nll_loss(model(x), y).backward()     # gradients come back averaged over every rank
    opt.step()

Gradients travel packed in flat buckets of about bucket_cap_mb MiB, one all-reduce per bucket
instead of one per parameter (every message pays the network's start-up latency): gradient
hooks fill them during backward, each bucket is all-reduced as soon as it is full, in the same
order on every rank, and unused parameters are flushed and counted at the end. The bucket
rules are torch's (so gloo adds in torch's order): BucketedDDP's docstring, step by step.
dist_sgd.ddp.ddp.DistributedDataParallel wraps this class through its extension points.
"""
import torch
import torch.distributed as dist
import torch.nn as nn

from dist_sgd.comm.flat import views
from dist_sgd.comm.ordered import in_order
from dist_sgd.ddp.hooks import call_when_backward_ends, hook_gradients
from dist_sgd.plumbing.mine import swap_in
from dist_sgd.plumbing.rank import world
from dist_sgd.sgd.sync import broadcast_parameters

MiB = 1024 * 1024


def assign_buckets(tensors, caps):
    """torch's compute_bucket_assignment_by_size: lists of positions, one list per bucket.

    Walk the tensors in the given order, one open bucket per (device, dtype) (one flat buffer
    each); a bucket closes once it holds >= its cap in bytes, caps[0] for the first of its kind,
    then caps[-1] (so one large tensor gets a bucket of its own). Closed ones first, in the
    order they closed; then the open ones, the kind seen first last (torch keeps the kinds in a
    C++ unordered_map, which here yields them in reverse order of insertion: tests/test_ddp.py
    compares this function with torch's dist._compute_bucket_assignment_by_size)."""
    done, open_, size, closed, kinds = [], {}, {}, {}, []
    for i, t in enumerate(tensors):
        key = (t.device, t.dtype)
        if key not in kinds:
            kinds.append(key)
        open_.setdefault(key, []).append(i)
        size[key] = size.get(key, 0) + t.numel() * t.element_size()
        if size[key] >= caps[min(closed.get(key, 0), len(caps) - 1)]:
            done.append(open_.pop(key))
            size[key], closed[key] = 0, closed.get(key, 0) + 1
    return done + [open_[key] for key in reversed(kinds) if key in open_]


class Bucket:
    """Parameters whose gradients travel together in one flat buffer."""

    def __init__(self, index, params, names):
        self.index, self.params, self.names = index, params, names
        self.flat = params[0].new_zeros(sum(p.numel() for p in params))
        self.views = views(self.flat, params)  # views[j]: params[j]'s slice of flat
        self.ready, self.future = [False] * len(params), None


class BucketedDDP(nn.Module):
    """Gradients averaged over ranks, in buckets, during backward; see the module docstring.

    1. Buckets: the trainable parameters' gradients travel packed in flat buffers of at most about
       bucket_cap_mb MiB, one all-reduce per bucket instead of one per parameter (every message pays
       the network's start-up latency). The rules are torch's (torch/nn/parallel/distributed.py and
       its C++ reducer), so that our buckets, and gloo's order of adding, are the same as torch's:
       - The first backward runs with one bucket, every parameter in forward order: nobody knows yet
         in which order the gradients will be ready (forward order is a guess, and a wrong guess
         would leave buckets waiting for a gradient that comes last).
       - At its end the buckets are rebuilt, once, in the order the gradients became ready on rank 0
         (broadcast: every rank must hold the same buckets). Now each bucket fills up in one stretch
         of backward and is sent as soon as it is full, while autograd computes earlier layers.
         rebuild_after=2 rebuilds one backward later (torch's static_graph=True: its first backward
         only records the graph); backward passes that do not synchronize (no_sync) do not count.
       - Parameters of different dtypes never share a bucket (one flat buffer each). In a rebuild,
         buckets filled up to their cap come first, in the order they filled; the partly filled
         last bucket of each dtype follows, the dtype whose first gradient was ready last first (so
         a float64 bucket can come before a float32 one): the order torch's reducer gives them, and
         the indices a communication hook sees.
       - bucket_cap_mb=None is torch's default: 25 MiB, but the first bucket only 1 MiB
         (dist._DEFAULT_FIRST_BUCKET_BYTES): the first gradients ready go out early instead of
         waiting for 25 MiB more of them. A number caps every bucket, the first one too.
       - rebuild_after=None (torch's find_unused_parameters=True, where the order may change from
         step to step) builds capped buckets in reverse parameter order once, and keeps them.
    2. Backward: a hook on each parameter fires when autograd has accumulated its gradient, which
       is copied into its bucket, times 1 / world size as torch does (summing those averages). A
       complete bucket is all-reduced asynchronously, buckets strictly in order: every rank must
       issue the same collectives in the same order.
    3. End of backward: a bucket still waiting for an unused parameter is completed with its .grad
       (or zeros) and sent anyway, so no rank waits for an all-reduce its peer never starts. One
       small all-reduce counts the ranks that used each parameter (torch's find_unused_parameters
       does the same): a parameter no rank used keeps its .grad (None stays None, as in torch, where
       a zero would still move momentum). The averages go into .grad before backward() returns.

    Extension points (dist_sgd.ddp.ddp.DistributedDataParallel holds this class and uses them):
        reduce(bucket) -> Future of the bucket's averaged flat buffer; None: the all-reduce above.
            With a reduce, gradients are copied unscaled (torch's comm hooks divide themselves).
        on_event(event, **fields): called at "hook", "launch", "done", "flush" and "synchronized".
        sync: False makes the next backward only accumulate local gradients (no_sync).
    Every collective goes through in_order (dist_sgd.comm.ordered): a reduce may issue more from
    callbacks, later.
    """

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
        # ---- exercise bucketed_ddp: start each complete bucket's average, in bucket order
        while self._next < len(self.buckets) and all(self.buckets[self._next].ready):
            bucket = self.buckets[self._next]
            bucket.future = in_order(lambda b=bucket: self.reduce(b) if self.reduce else
                                     _all_reduce(b.flat), later=self.reduce is not None)
            self._next += 1
        # ---- end of exercise
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


def _all_reduce(tensor):
    """Start summing tensor over the ranks: a Future of the summed tensor (all_reduce's own
    Future holds a list of it)."""
    return dist.all_reduce(tensor, async_op=True).get_future().then(lambda f: f.value()[0])


# DIST_SGD_MINE: a learner's version replaces ours
swap_in(globals(), "bucketed_ddp", ("BucketedDDP",), lesson="07")
