"""What the DDP wrappers need around autograd and the network, kept apart from their idea.

- call_when_backward_ends(fn): autograd's engine calls fn once the backward pass is over.
- start_all_reduce(tensor, all_reduce): an all-reduce that runs while backward goes on,
  returned as a torch.futures.Future, for torch's dist.all_reduce and for a hand-written,
  blocking one such as dist_sgd.comm.collectives.all_reduce.
- GradBucket: what a communication hook sees of one bucket, with the methods of torch's
  torch.distributed.GradBucket, so torch's own hooks (allreduce_hook, fp16_compress_hook,
  powerSGD_hook) run on our DistributedDataParallel unchanged.
"""
import threading
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.distributed as dist

from dist_sgd.comm.flat import views


def call_when_backward_ends(callback):
    """Have autograd call `callback` after the last gradient of the running backward pass
    has been accumulated, before loss.backward() returns.

    Why a private torch API: no public one says "backward is over". torch's own DDP reducer
    (C++) does exactly this (Engine::queue_callback in Reducer::mark_variable_ready); its
    Python code reaches the engine through a deprecated attribute of torch.autograd's legacy
    tensor class. torch._C._ImperativeEngine() is a handle to the process's one engine.
    Only valid while a backward pass runs, i.e. from inside a gradient hook.
    """
    torch._C._ImperativeEngine().queue_callback(callback)


# One helper thread per process, shared by every wrapper, for blocking all_reduce functions.
# Why shared: every rank must issue its collectives in the same order, and a hand-written
# all_reduce pairs its messages by order and tag. Two wrappers with a thread each (a GAN's G
# and D in one backward) would run two all-reduces at once, and their messages would pair
# with the wrong receives: wrong sums, or gloo aborting on a size mismatch. One FIFO thread
# runs them one after the other, in the order the hooks started them (the same on every
# rank, because every rank runs the same backward).
_launcher = None
_launcher_lock = threading.Lock()


def _shared_launcher():
    global _launcher
    with _launcher_lock:
        if _launcher is None:
            _launcher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="all_reduce")
        return _launcher


def start_all_reduce(tensor, all_reduce=None):
    """Start summing `tensor` over all ranks, in place; returns a Future of `tensor`.

    all_reduce None (or dist.all_reduce): torch's, asynchronous already (its backend works
    on its own threads). Otherwise a blocking function all_reduce(tensor) that sums over the
    default group: it runs on the shared helper thread, and backward goes on meanwhile
    (torch's kernels and our send/recv release the GIL).
    """
    if all_reduce is None or all_reduce is dist.all_reduce:
        work = dist.all_reduce(tensor, async_op=True)
        return work.get_future().then(lambda fut: fut.value()[0])
    future = torch.futures.Future()

    def run():
        try:
            all_reduce(tensor)
        except BaseException as error:  # the caller's wait() raises it
            future.set_exception(error)
        else:
            future.set_result(tensor)

    _shared_launcher().submit(run)
    return future


class GradBucket:
    """One bucket as a communication hook sees it (torch.distributed.GradBucket's methods).

    buffer(): the flat gradients of the bucket's parameters, one after the other (not yet
    divided by the world size: under a hook, dividing is the hook's job, as in torch);
    gradients(): views of buffer(), one per parameter, shaped like it; set_buffer(t): replace
    the buffer (fp16_compress_wrapper sends a float16 copy).
    """

    def __init__(self, index, flat, params, is_last):
        self._index, self._buffer, self._params, self._is_last = index, flat, params, is_last

    def index(self):
        return self._index

    def is_last(self):
        return self._is_last

    def buffer(self):
        return self._buffer

    def set_buffer(self, tensor):
        self._buffer = tensor

    def parameters(self):
        return list(self._params)

    def gradients(self):
        return views(self._buffer, self._params)


def all_reduce_hook(all_reduce):
    """A comm hook that averages a bucket with `all_reduce` (dist.all_reduce or a
    hand-written one): divide first, as torch's allreduce_hook does, then sum."""

    def hook(state, bucket):
        flat = bucket.buffer()
        flat.div_(dist.get_world_size())
        return start_all_reduce(flat, all_reduce)

    return hook
