"""DistributedDataParallel with torch's interface, built on the core of lesson 07.

    model = DistributedDataParallel(Net())      # inside a process group; torch's arguments
    loss = F.nll_loss(model(x), y)               # forward: buffers broadcast, then the module's
    loss.backward()                              # gradients come back averaged over every rank
    opt.step()

The idea is all in dist_sgd/ddp/bucketed.py (BucketedDDP: buckets in torch's layout, filled by
gradient hooks, all-reduced in order during backward, unused parameters flushed and counted).
This wrapper is a BucketedDDP and adds, through the core's extension points and a longer
forward, what a training loop written for torch's DDP expects:

    torch's constructor arguments   accepted with torch's meaning, or refused by name (arguments.py)
    register_comm_hook(state, hook) the core's `reduce`: torch's hook contract (GradBucket)
    all_reduce=                     a hand-written all-reduce, as a comm hook on a helper thread
    no_sync()                       the core's `sync`, decided in forward as torch decides it
    buffers                         rank 0's buffers broadcast before a forward, when torch's are
    device_ids / output_device      inputs moved to the module's one device
    .trace                          the core's `on_event`: when each hook, launch, done happened
"""
import contextlib
import time

import torch
import torch.distributed as dist

from dist_sgd.comm.ordered import start_all_reduce
from dist_sgd.ddp.arguments import check_torch_arguments, single_device, to_device
from dist_sgd.ddp.bucketed import BucketedDDP
from dist_sgd.ddp.grad_bucket import GradBucket


class DistributedDataParallel(BucketedDDP):
    """torch.nn.parallel.DistributedDataParallel's interface around BucketedDDP.

    DistributedDataParallel(module, bucket_cap_mb=None, all_reduce=None, **torch_arguments):
    bucket_cap_mb as torch's (None: 25 MiB, the first bucket 1 MiB). all_reduce: None for
    torch.distributed.all_reduce, or a hand-written blocking one with the same in-place
    signature (dist_sgd.comm.collectives.all_reduce), run on a helper thread. Of torch's other
    arguments, device_ids / output_device (one device, the module's), broadcast_buffers,
    init_sync, find_unused_parameters, static_graph, check_reduction and dim are accepted with
    torch's meaning; the rest raise ValueError naming the argument unless left at torch's default.

    The buckets keep torch's timing: find_unused_parameters=False (default), one bucket in the first
    backward, then rebuilt in gradient-ready order; static_graph=True, rebuilt one backward later
    (torch's first backward with a static graph only records it); find_unused_parameters=True alone,
    capped buckets in reverse parameter order, never rebuilt. Unused parameters are handled either
    way (the core counts them).
    """

    def __init__(self, module, bucket_cap_mb=None, all_reduce=None, *, device_ids=None,
                 output_device=None, broadcast_buffers=True, init_sync=True,
                 find_unused_parameters=False, static_graph=False, **torch_arguments):
        check_torch_arguments(module, bucket_cap_mb, torch_arguments)  # refused up front
        device = single_device(module, device_ids, output_device)
        # torch rebuilds its buckets once, after the first backward that synchronizes; with a
        # static graph after the second (even with find_unused_parameters); with
        # find_unused_parameters alone never.
        rebuild_after = 2 if static_graph else None if find_unused_parameters else 1
        super().__init__(module, bucket_cap_mb, init_sync=init_sync, rebuild_after=rebuild_after)
        self._device = device
        self.broadcast_buffers = broadcast_buffers
        self.require_backward_grad_sync = True  # no_sync() turns it off; forward passes it on
        # torch's: False after a forward that set up no synchronizing backward (inside no_sync,
        # or under torch.no_grad()); the next forward then skips the buffer broadcast.
        self.require_forward_param_sync = True
        self._trace, self._comm_hook = None, None
        if all_reduce is not None and all_reduce is not dist.all_reduce:
            self.register_comm_hook(None, _all_reduce_hook(all_reduce))

    # ---- communication hooks (torch's contract) ----------------------------------------------

    def register_comm_hook(self, state, hook):
        """hook(state, bucket) -> torch.futures.Future of the bucket's averaged flat gradient,
        called as each bucket is launched; `bucket` has torch's GradBucket methods. Runs
        torch's default_hooks.allreduce_hook / fp16_compress_hook and powerSGD_hook, also on
        several buckets: the core runs each hook after the previous one is done (in_order)."""
        if self._comm_hook is not None:
            raise RuntimeError("register_comm_hook can be called only once (all_reduce= "
                               "registers one too)")
        if not callable(hook):
            raise TypeError(f"hook must be callable as hook(state, bucket), got {hook!r}")
        self._comm_hook = (state, hook)
        self.reduce = self._run_comm_hook

    def _run_comm_hook(self, bucket):
        state, hook = self._comm_hook
        is_last = bucket.index == len(self.buckets) - 1
        future = hook(state, GradBucket(bucket.index, bucket.flat, bucket.params, is_last,
                                        params=bucket.params))
        if not isinstance(future, torch._C.Future):  # torch.futures.Future or its C++ base
            raise TypeError(f"the communication hook {hook!r} returned {type(future)}, "
                            "not a torch.futures.Future")
        numel = bucket.flat.numel()
        return future.then(lambda f: _flat_result(f.value(), numel, hook))

    # ---- forward: no_sync, buffers, device -----------------------------------------------------

    def forward(self, *inputs, **kwargs):
        # As torch's: whether the coming backward synchronizes is decided here, so a forward
        # inside no_sync() followed by a backward outside it still only accumulates.
        if torch.is_grad_enabled():
            self.sync = self.require_backward_grad_sync
        # torch's rule: rank 0's buffers before a forward, unless the previous forward set up
        # no synchronizing backward (inside no_sync(), or a train-mode forward under no_grad):
        # then each rank keeps the running statistics that forward left it.
        if self.broadcast_buffers and self.require_forward_param_sync:
            with torch.no_grad():
                for buffer in self.module.buffers():
                    dist.broadcast(buffer, 0)
        if self._device is not None:
            inputs, kwargs = to_device((inputs, kwargs), self._device)
        output = self.module(*inputs, **kwargs)
        self.require_forward_param_sync = torch.is_grad_enabled() and \
            self.require_backward_grad_sync
        return output

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside only accumulate local gradients (gradient accumulation);
        the first backward after it all-reduces the accumulated sum, as torch's no_sync."""
        previous, self.require_backward_grad_sync = self.require_backward_grad_sync, False
        try:
            yield
        finally:
            self.require_backward_grad_sync = previous

    # ---- the trace: a list of events, when set (lesson 07's timeline) ----------------------------

    @property
    def trace(self):
        return self._trace

    @trace.setter
    def trace(self, events):
        self._trace = events
        self.on_event = None if events is None else self._record

    def _record(self, event, **fields):
        self._trace.append(dict(event=event, t=time.perf_counter(), **fields))


def _flat_result(value, numel, hook):
    if not (isinstance(value, torch.Tensor) and value.numel() == numel):
        raise TypeError(f"the communication hook {hook!r} must return a Future of the bucket's "
                        f"flat tensor ({numel} elements), got {type(value).__name__} "
                        f"{tuple(getattr(value, 'shape', ()))}")
    return value


def _all_reduce_hook(all_reduce):
    """A comm hook that averages a bucket with a hand-written, blocking `all_reduce`: divide
    first, as torch's allreduce_hook does, then sum on the shared helper thread."""

    def hook(state, bucket):
        flat = bucket.buffer()
        flat.div_(dist.get_world_size())
        return start_all_reduce(flat, all_reduce)

    return hook
