"""DistributedDataParallel from scratch: buckets of gradients, all-reduced during backward.

    model = DistributedDataParallel(Net(), bucket_cap_mb=25.0)   # inside a process group
    loss = F.nll_loss(model(x), y)      # forward: just the module's
    loss.backward()                     # gradients come back averaged over every rank
    opt.step()

What it does, in the order it happens:
1. Construction: every rank takes rank 0's parameters and buffers (ranks may start different),
   and the trainable parameters are grouped, in *reverse* order, into buckets of about
   `bucket_cap_mb` MiB (None: one bucket; 0: one bucket per parameter). Reverse, because
   backward produces the last layer's gradients first.
2. Backward: a hook on each parameter fires as soon as autograd has accumulated its gradient;
   the gradient (divided by the world size) is copied into its bucket. When a bucket is full it
   is all-reduced *asynchronously*, while autograd goes on computing earlier layers' gradients:
   communication overlaps computation. Buckets are launched strictly in bucket order, because
   every rank must issue the same collectives in the same order.
3. End of backward: buckets still waiting for a gradient (a parameter unused in this step on
   this rank) are completed - with the parameter's existing .grad, else zeros - and launched in
   order, so no rank ever waits for an all-reduce its peer never starts. Then we wait for every
   bucket and copy the averages back into .grad, all before loss.backward() returns.

Buffers (BatchNorm's running statistics) are broadcast at construction only; torch's DDP, with
its default broadcast_buffers=True, broadcasts them from rank 0 before every forward as well.
None of the lessons' models has buffers that change, so we leave that out (an exercise).

Unused parameters: each bucket carries, after its gradients, one "had a gradient" flag per
parameter; the same all-reduce sums them, so every rank learns how many ranks used each
parameter at the price of a few extra numbers per bucket (torch DDP's find_unused_parameters
spends an extra collective on it). A parameter no rank used keeps its .grad untouched (None
stays None, as in torch DDP), so an optimizer skips it instead of applying momentum to a zero.
"""
import contextlib
import time
import weakref
import zlib
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.distributed as dist
import torch.nn as nn

from .sync import broadcast_parameters

MiB = 1024 * 1024

# How to run code when the whole backward pass is over: ask autograd's engine to call us back.
# torch's own DDP reducer (C++) does exactly this (Engine::queue_callback in
# Reducer::mark_variable_ready), and its Python code reaches the engine as the
# `_execution_engine` attribute of torch.autograd's legacy tensor class, a deprecated name this
# project does not use. That attribute is just an instance of torch._C._ImperativeEngine, a
# handle to the one engine of the process, so we make our own handle (a private torch API, as
# torch's own wrappers use). A callback queued while backward runs is called after the last
# gradient is accumulated and before backward() returns (lesson 07 and the tests check it).
_ENGINE = torch._C._ImperativeEngine()


class AllReduceLauncher:
    """Starts SUM all-reduces in order; each start returns a handle with .wait().

    torch.distributed.all_reduce is asynchronous already (async_op=True returns a Work that
    its backend progresses on its own threads). Ours, dist_sgd.collectives.all_reduce, blocks
    until done, so it runs on one helper thread: backward goes on meanwhile (torch's kernels and
    our send/recv release the GIL), and a single thread keeps the launch order, which every
    rank must agree on. Waiting for it at the end of backward instead would be correct too, but
    would serialize communication after computation and lose the overlap we are here to show.
    """

    def __init__(self, all_reduce=None):
        self.all_reduce = None if all_reduce is dist.all_reduce else all_reduce
        self._pool = None
        if self.all_reduce is not None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="all_reduce")

    def start(self, tensor, on_done=None):
        if self.all_reduce is None:
            work = dist.all_reduce(tensor, async_op=True)
            if on_done is None:
                return work
            # on_done runs on gloo/NCCL's thread when the result is there; waiting for that
            # callback too makes the trace complete whenever wait() returns.
            return _Chained(work, work.get_future().then(lambda _fut: on_done()))
        return _FutureWork(self._pool.submit(self._run, tensor, on_done))

    def _run(self, tensor, on_done):
        self.all_reduce(tensor)
        if on_done is not None:
            on_done()


class _Chained:
    def __init__(self, work, callback_future):
        self.work, self.callback_future = work, callback_future

    def wait(self):
        self.work.wait()
        self.callback_future.wait()


class _FutureWork:
    def __init__(self, future):
        self.future = future

    def wait(self):
        self.future.result()  # re-raises, here, whatever the helper thread raised


class Bucket:
    """Trainable parameters whose gradients travel together in one flat buffer."""

    def __init__(self, index, params, names):
        self.index, self.params, self.names = index, params, names
        self.numel = sum(p.numel() for p in params)
        p0 = params[0]
        # [gradient of params[0] | gradient of params[1] | ... | one used-flag per parameter]
        self.buffer = torch.zeros(self.numel + len(params), dtype=p0.dtype, device=p0.device)
        self.flags = self.buffer[self.numel:]
        self.views, offset = [], 0
        for p in params:
            self.views.append(self.buffer[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        self.nbytes = self.numel * p0.element_size()
        self.reset()

    def reset(self):
        self.ready = [False] * len(self.params)
        self.used = [False] * len(self.params)  # this rank had a gradient for it
        self.pending = len(self.params)
        self.work = None


def assign_buckets(named_params, bucket_cap_mb):
    """Group (name, param) pairs, in reverse order, into lists of at most ~bucket_cap_mb MiB.

    A bucket closes as soon as it reaches the cap (so one large parameter gets a bucket of its
    own), and parameters of different dtype or device never share one (one flat buffer each).
    """
    if bucket_cap_mb is not None and bucket_cap_mb < 0:
        raise ValueError(f"bucket_cap_mb must be >= 0 or None, got {bucket_cap_mb!r}")
    cap = float("inf") if bucket_cap_mb is None else bucket_cap_mb * MiB
    done, open_, size = [], {}, {}
    for name, p in reversed(named_params):
        key = (p.device, p.dtype)
        open_.setdefault(key, []).append((name, p))
        size[key] = size.get(key, 0) + p.numel() * p.element_size()
        if size[key] >= cap:
            done.append(open_.pop(key))
            size[key] = 0
    done.extend(open_.values())
    order = {id(p): i for i, (_, p) in enumerate(reversed(named_params))}
    return sorted(done, key=lambda b: order[id(b[0][1])])


class DistributedDataParallel(nn.Module):
    """Data-parallel training: gradients averaged over ranks, in buckets, during backward."""

    def __init__(self, module, bucket_cap_mb=25.0, all_reduce=None):
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError("DistributedDataParallel needs a process group: build it inside "
                               "dist_sgd.launch.launch(...) or a torchrun'd script")
        self.module = module
        self.world_size = dist.get_world_size()
        self.require_backward_grad_sync = True  # no_sync() turns it off ...
        self._sync_next_backward = True  # ... and forward() passes it on to backward
        self.trace = None  # set to a list to record hook/launch/done times (lesson 07)
        self._comm = AllReduceLauncher(all_reduce)
        _broadcast_from_rank0(module)
        # module.named_parameters() yields a tied (shared) Parameter once: reduced once.
        trainable = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self.buckets = [Bucket(i, [p for _, p in group], [n for n, _ in group])
                        for i, group in enumerate(assign_buckets(trainable, bucket_cap_mb))]
        self._slot = {p: (b.index, j) for b in self.buckets for j, p in enumerate(b.params)}
        self._next_bucket = 0       # buckets launch in this order only
        self._in_backward = False   # a hook fired and the end-of-backward work is still due
        ddp = weakref.ref(self)     # the hooks must not keep a dropped wrapper alive

        def hook(param):
            if ddp() is not None:
                ddp()._grad_ready(param)

        self._hooks = [p.register_post_accumulate_grad_hook(hook) for _, p in trainable]

    def forward(self, *inputs, **kwargs):
        # As torch's: whether the coming backward synchronizes is decided here, so a forward
        # inside no_sync() followed by a backward outside it still only accumulates.
        if torch.is_grad_enabled():
            self._sync_next_backward = self.require_backward_grad_sync
        return self.module(*inputs, **kwargs)

    def parameters(self, recurse=True):
        return self.module.parameters(recurse)

    def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):
        return self.module.named_parameters(prefix, recurse, remove_duplicate)

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside only accumulate local gradients (gradient accumulation);
        the first backward after it all-reduces the accumulated sum, as torch's no_sync."""
        previous, self.require_backward_grad_sync = self.require_backward_grad_sync, False
        try:
            yield
        finally:
            self.require_backward_grad_sync = previous

    def remove_hooks(self):
        """Detach this wrapper from the module's parameters (to wrap the module again)."""
        for handle in self._hooks:
            handle.remove()
        self._hooks = []

    # ---- during backward ---------------------------------------------------------------

    def _grad_ready(self, param):
        """Autograd accumulated param.grad: put it in its bucket; launch what is complete."""
        if not self._sync_next_backward:
            return
        if not self._in_backward:
            self._in_backward = True
            _ENGINE.queue_callback(self.finish_gradient_synchronization)
        b, j = self._slot[param]
        bucket = self.buckets[b]
        if bucket.ready[j]:
            raise RuntimeError(f"gradient of {bucket.names[j]} became ready twice in one "
                               "backward pass (reentrant backward?); not supported")
        self._record("hook", bucket=b, param=bucket.names[j])
        self._fill(bucket, j, param.grad)
        self._launch_complete_buckets()

    def _fill(self, bucket, j, grad):
        if grad is None:
            bucket.views[j].zero_()
        else:  # divide on the way in, as torch does: the SUM is then the average
            torch.div(grad, self.world_size, out=bucket.views[j])
        bucket.used[j] = grad is not None
        bucket.ready[j] = True
        bucket.pending -= 1

    def _launch_complete_buckets(self):
        buckets = self.buckets
        while self._next_bucket < len(buckets) and buckets[self._next_bucket].pending == 0:
            bucket = buckets[self._next_bucket]
            bucket.flags.copy_(torch.tensor(bucket.used, dtype=bucket.flags.dtype))
            self._record("launch", bucket=bucket.index)
            on_done = None
            if self.trace is not None:
                on_done = lambda i=bucket.index: self._record("done", bucket=i)  # noqa: E731
            bucket.work = self._comm.start(bucket.buffer, on_done)
            self._next_bucket += 1

    def finish_gradient_synchronization(self):
        """Wait for every bucket and write the averages into .grad.

        Called by autograd's engine when backward ends, so usually there is nothing left to do
        here: calling it again (say, before optimizer.step()) is harmless.
        """
        if not self._in_backward:
            return
        self._record("flush")
        for bucket in self.buckets[self._next_bucket:]:  # not complete: unused parameters
            for j, p in enumerate(bucket.params):
                if not bucket.ready[j]:
                    self._fill(bucket, j, p.grad)
        self._launch_complete_buckets()
        for bucket in self.buckets:
            bucket.work.wait()
            used = bucket.flags.tolist()  # how many ranks had each gradient (one sync per bucket)
            for p, view, n_used in zip(bucket.params, bucket.views, used):
                if n_used == 0:
                    continue  # no rank used it: leave .grad as it was, as torch DDP does
                if p.grad is None:
                    p.grad = view.clone()
                else:
                    p.grad.copy_(view)
            bucket.reset()
        self._next_bucket = 0
        self._in_backward = False
        self._record("synchronized")

    def _record(self, event, **fields):
        if self.trace is not None:
            self.trace.append(dict(event=event, t=time.perf_counter(), **fields))


def _broadcast_from_rank0(module):
    """Everyone starts from rank 0's parameters and buffers. First check that everyone holds
    the same shapes: a mismatch would otherwise surface as a hang or a garbled broadcast."""
    tensors = list(module.parameters()) + list(module.buffers())
    shapes = str([tuple(t.shape) for t in tensors]).encode()
    mine = [len(tensors), sum(t.numel() for t in tensors), zlib.crc32(shapes)]
    theirs = torch.tensor(mine, dtype=torch.int64,
                          device=tensors[0].device if tensors else torch.device("cpu"))
    dist.broadcast(theirs, 0)
    if theirs.tolist() != mine:
        raise ValueError(f"rank {dist.get_rank()}: the module differs from rank 0's "
                         f"(tensors, elements, shape checksum: {mine} here, {theirs.tolist()} "
                         "on rank 0)")
    broadcast_parameters(module, src=0)
