"""DistributedDataParallel from scratch: buckets of gradients, all-reduced during backward.

    model = DistributedDataParallel(Net(), bucket_cap_mb=25.0)   # inside a process group
    loss = F.nll_loss(model(x), y)      # forward: just the module's
    loss.backward()                     # gradients come back averaged over every rank
    opt.step()

Read it in two parts. BucketedDDP, first, is the whole idea (step 3 of lesson 07, after
ddp_steps.py's steps 1 and 2):
1. Construction: every rank takes rank 0's parameters and buffers (ranks may start different),
   and the trainable parameters are grouped, in *reverse* order, into buckets of about
   `bucket_cap_mb` MiB (None: one bucket; 0: one bucket per parameter). Reverse, because
   backward produces the last layer's gradients first.
2. Backward: a hook on each parameter fires as soon as autograd has accumulated its gradient,
   which is copied into its bucket. When a bucket is full it is all-reduced *asynchronously*,
   while autograd goes on computing earlier layers' gradients: communication overlaps
   computation. Buckets are launched strictly in bucket order, because every rank must issue
   the same collectives in the same order.
3. End of backward: buckets still waiting for a gradient (a parameter unused in this step on
   this rank) are completed with the parameter's existing .grad, else zeros, and launched in
   order, so no rank ever waits for an all-reduce its peer never starts. Then we wait for every
   bucket and copy the averages back into .grad, all before loss.backward() returns.

DistributedDataParallel, second, adds what a real training loop needs, one method each: torch's
constructor arguments (accepted with torch's meaning, or refused by name), communication hooks
(register_comm_hook, with torch's contract; all_reduce= is one), gradients no rank produced
left None (as torch's, where a zero would move momentum), no_sync() for gradient accumulation,
buffers broadcast before each forward, and a trace of what happened when (lesson 07's timeline).
"""
import contextlib
import time
import weakref

import torch
import torch.distributed as dist
import torch.nn as nn

from dist_sgd.comm.flat import views
from dist_sgd.ddp.arguments import check_torch_arguments, single_device, to_device
from dist_sgd.ddp.hooks import GradBucket, all_reduce_hook, call_when_backward_ends
from dist_sgd.plumbing.rank import world
from dist_sgd.sgd.sync import broadcast_parameters

MiB = 1024 * 1024

# ============================== the core: step 3 =============================================


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


class Bucket:
    """Trainable parameters whose gradients travel together in one flat buffer."""

    def __init__(self, index, params, names):
        self.index, self.params, self.names = index, params, names
        self.numel = sum(p.numel() for p in params)
        self.flat = torch.zeros(self.numel, dtype=params[0].dtype, device=params[0].device)
        self.views = views(self.flat, params)  # views[j]: params[j]'s slice of flat
        self.nbytes = self.numel * params[0].element_size()
        self.reset()

    def reset(self):
        self.ready = [False] * len(self.params)
        self.pending = len(self.params)
        self.future = None  # the all-reduce in flight; its value: the averaged flat buffer

    def fill(self, j, grad):
        if self.ready[j]:
            raise RuntimeError(f"gradient of {self.names[j]} became ready twice in one "
                               "backward pass (reentrant backward, checkpointing?): not supported")
        if grad is None:
            self.views[j].zero_()
        elif grad.is_sparse:
            raise ValueError(f"{self.names[j]} has a sparse gradient (nn.Embedding(sparse=True)?);"
                             " our DistributedDataParallel handles dense gradients only")
        else:
            self.views[j].copy_(grad)
        self.ready[j] = True
        self.pending -= 1


class BucketedDDP(nn.Module):
    """Data-parallel training: gradients averaged over ranks, in buckets, during backward."""

    def __init__(self, module, bucket_cap_mb=25.0, init_sync=True):
        super().__init__()
        if not isinstance(module, nn.Module):
            raise TypeError(f"DistributedDataParallel wraps an nn.Module, got {type(module)}")
        _, self.world_size = world("DistributedDataParallel")
        self.module = module
        if init_sync:  # everyone starts from rank 0's weights (False: the caller promises it)
            broadcast_parameters(module, src=0)
        # module.named_parameters() yields a tied (shared) Parameter once: reduced once.
        trainable = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        if not trainable:
            raise RuntimeError("DistributedDataParallel is not needed when a module doesn't "
                               "have any parameter that requires a gradient.")  # torch's words
        self.buckets = [Bucket(i, [p for _, p in group], [n for n, _ in group])
                        for i, group in enumerate(assign_buckets(trainable, bucket_cap_mb))]
        self._slot = {p: (b, j) for b in self.buckets for j, p in enumerate(b.params)}
        self._next_bucket = 0       # buckets launch in this order only
        self._in_backward = False   # a hook fired and the end-of-backward work is still due
        ddp = weakref.ref(self)     # the hooks must not keep a dropped wrapper alive

        def hook(param):
            if ddp() is not None:
                ddp()._grad_ready(param)

        self._hooks = [p.register_post_accumulate_grad_hook(hook) for _, p in trainable]

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    def _grad_ready(self, param):
        """Autograd accumulated param.grad: put it in its bucket; launch what is complete."""
        if not self._in_backward:
            self._in_backward = True
            call_when_backward_ends(self.finish_gradient_synchronization)
        bucket, j = self._slot[param]
        bucket.fill(j, param.grad)
        self._launch_complete_buckets()

    def _launch_complete_buckets(self):
        buckets = self.buckets
        while self._next_bucket < len(buckets) and buckets[self._next_bucket].pending == 0:
            bucket = buckets[self._next_bucket]
            bucket.future = self._all_reduce_bucket(bucket)
            self._next_bucket += 1

    def _all_reduce_bucket(self, bucket):
        """Start averaging the bucket; returns a Future of the averaged flat buffer (here a
        list holding it, as torch's all_reduce futures do; finish unpacks it).
        Divide first, then SUM (as torch's DDP: float16 sums cannot overflow)."""
        bucket.flat.div_(self.world_size)
        return dist.all_reduce(bucket.flat, async_op=True).get_future()

    def finish_gradient_synchronization(self):
        """Wait for every bucket and write the averages into .grad.

        Called by autograd's engine when backward ends, so usually there is nothing left to do
        here: calling it again (say, before optimizer.step()) is harmless.
        """
        if not self._in_backward:
            return
        try:
            for bucket in self.buckets[self._next_bucket:]:  # not complete: unused parameters
                for j, p in enumerate(bucket.params):
                    if not bucket.ready[j]:
                        bucket.fill(j, p.grad)
            self._launch_complete_buckets()
            averaged = [bucket.future.wait() for bucket in self.buckets]
            for bucket, flat in zip(self.buckets, averaged):
                self._write_grads(bucket, flat[0] if isinstance(flat, list) else flat)
        finally:
            for bucket in self.buckets:
                bucket.reset()
            self._next_bucket = 0
            self._in_backward = False

    def _write_grads(self, bucket, averaged):
        for p, mean in zip(bucket.params, views(averaged, bucket.params)):
            self._write_grad(p, mean)

    def _write_grad(self, p, mean):
        if p.grad is None:
            p.grad = mean.to(p.dtype, copy=True)  # a copy: the bucket is reused next step
        else:
            p.grad.copy_(mean)


# ============================== the extras ===================================================

class DistributedDataParallel(BucketedDDP):
    """BucketedDDP plus what torch's offers a training loop; see the module docstring.

    DistributedDataParallel(module, bucket_cap_mb=25.0, all_reduce=None, **torch_arguments):
    bucket_cap_mb None means one bucket (torch: None means its 25 MiB default). all_reduce:
    None for torch.distributed.all_reduce, or a hand-written blocking one with the same
    in-place signature (dist_sgd.comm.collectives.all_reduce), run on a helper thread. Of torch's
    other arguments, device_ids / output_device (one device, the module's), broadcast_buffers,
    init_sync, find_unused_parameters, static_graph, check_reduction and dim are accepted with
    torch's meaning; the rest raise ValueError naming the argument unless left at torch's default.
    """

    def __init__(self, module, bucket_cap_mb=25.0, all_reduce=None, *, device_ids=None,
                 output_device=None, broadcast_buffers=True, init_sync=True, **torch_arguments):
        check_torch_arguments(bucket_cap_mb, torch_arguments)  # refused by name, up front
        device = single_device(module, device_ids, output_device)
        super().__init__(module, bucket_cap_mb, init_sync)
        self._device = device
        self.broadcast_buffers = broadcast_buffers
        self.require_backward_grad_sync = True  # no_sync() turns it off ...
        self._sync_next_backward = True  # ... and forward() passes it on to backward
        self.trace = None  # set to a list to record hook/launch/done times (lesson 07)
        self._params = [p for b in self.buckets for p in b.params]
        self._used = None  # per parameter: how many ranks had a gradient (_Later)
        self._comm_hook = None
        if all_reduce is not None and all_reduce is not dist.all_reduce:
            self.register_comm_hook(None, all_reduce_hook(all_reduce))

    # ---- communication hooks (torch's contract) ----------------------------------------------

    def register_comm_hook(self, state, hook):
        """hook(state, bucket) -> torch.futures.Future of the bucket's averaged flat gradient,
        called as each bucket is launched; `bucket` has torch's GradBucket methods. Runs
        torch's default_hooks.allreduce_hook / fp16_compress_hook and powerSGD_hook."""
        if self._comm_hook is not None:
            raise RuntimeError("register_comm_hook can be called only once (all_reduce= "
                               "registers one too)")
        if not callable(hook):
            raise TypeError(f"hook must be callable as hook(state, bucket), got {hook!r}")
        self._comm_hook = (state, hook)

    def _all_reduce_bucket(self, bucket):
        self._record("launch", bucket=bucket.index)
        if self._comm_hook is None:
            future = super()._all_reduce_bucket(bucket)
        else:
            state, hook = self._comm_hook
            is_last = bucket.index == len(self.buckets) - 1
            future = hook(state, GradBucket(bucket.index, bucket.flat, bucket.params, is_last))
            if not isinstance(future, torch._C.Future):  # torch.futures.Future or its C++ base
                raise TypeError(f"the communication hook {hook!r} returned {type(future)}, "
                                "not a torch.futures.Future")
            future = future.then(lambda f, n=bucket.numel: _flat_result(f.value(), n, hook))
        if self.trace is not None:  # chained, so the record is there when wait() returns
            future = future.then(lambda f: (self._record("done", bucket=bucket.index),
                                            f.value())[1])
        return future

    # ---- unused parameters: a gradient no rank produced stays as it was (None stays None) ---

    def _launch_complete_buckets(self):
        super()._launch_complete_buckets()
        if self._next_bucket == len(self.buckets) and self._used is None:
            # One small extra all-reduce counts, per parameter, the ranks that had a gradient
            # (torch's find_unused_parameters does the same). Without a comm hook it goes now,
            # behind the last bucket; a hook may still be issuing collectives from callbacks,
            # so then it waits until the hooks' futures are done (in _write_grad).
            had = torch.tensor([float(p.grad is not None) for p in self._params],
                               device=self.buckets[0].flat.device)
            self._used = _Later(had, start_now=self._comm_hook is None)

    def _write_grad(self, p, mean):
        if self._used.counts(self._params)[p] > 0:  # else no rank used it: leave .grad as it
            super()._write_grad(p, mean)             # was (None stays None), as torch DDP does

    def finish_gradient_synchronization(self):
        if not self._in_backward:
            return
        self._record("flush")
        try:
            super().finish_gradient_synchronization()
        finally:
            self._used = None
        self._record("synchronized")

    # ---- no_sync, forward (buffers, device) and the trace ----------------------------------------

    def forward(self, *inputs, **kwargs):
        # As torch's: whether the coming backward synchronizes is decided here, so a forward
        # inside no_sync() followed by a backward outside it still only accumulates.
        if torch.is_grad_enabled():
            self._sync_next_backward = self.require_backward_grad_sync
        if self.broadcast_buffers:  # torch's default: rank 0's buffers before every forward
            with torch.no_grad():
                for buffer in self.module.buffers():
                    dist.broadcast(buffer, 0)
        if self._device is not None:
            inputs, kwargs = to_device((inputs, kwargs), self._device)
        return self.module(*inputs, **kwargs)

    def _grad_ready(self, param):
        if self._sync_next_backward:
            bucket, j = self._slot[param]
            self._record("hook", bucket=bucket.index, param=bucket.names[j])
            super()._grad_ready(param)

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

    def _record(self, event, **fields):
        if self.trace is not None:
            self.trace.append(dict(event=event, t=time.perf_counter(), **fields))


def _flat_result(value, numel, hook):
    if not (isinstance(value, torch.Tensor) and value.numel() == numel):
        raise TypeError(f"the communication hook {hook!r} must return a Future of the bucket's "
                        f"flat tensor ({numel} elements), got {type(value).__name__} "
                        f"{tuple(getattr(value, 'shape', ()))}")
    return value


class _Later:
    """An all-reduce of per-parameter counts, started now or when first needed."""

    def __init__(self, counts, start_now):
        self._counts, self._work, self._result = counts, None, None
        if start_now:
            self._work = dist.all_reduce(self._counts, async_op=True)

    def counts(self, params):
        if self._result is None:
            if self._work is None:
                dist.all_reduce(self._counts)
            else:
                self._work.wait()
            self._result = dict(zip(params, self._counts.tolist()))
        return self._result
