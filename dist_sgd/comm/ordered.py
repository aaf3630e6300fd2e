"""Collectives issued in one order per process, also from callbacks and helper threads.

Collectives are paired across ranks by the order each rank issues them. DDP and FSDP issue
theirs while backward runs, some from callbacks of earlier ones, some from a helper thread;
this module keeps one order anyway:

- in_order(start): run start(), which issues collectives, only after every earlier in_order
  call has issued all of its own: every rank issues them in one order, also when some are
  issued from callbacks (a PowerSGD bucket's P, then Q).
- start_all_reduce(tensor, all_reduce): an all-reduce that runs while backward goes on,
  returned as a torch.futures.Future, for torch's dist.all_reduce and for a hand-written,
  blocking one such as dist_sgd.comm.collectives.all_reduce (on one shared helper thread).
- settle(timeout): wait until none of the above still runs: every start in order has issued
  all it will, the helper thread has run every all-reduce given to it, every callback of ours
  on torch's futures has run. launch() calls it in every rank before the rank leaves its group;
  at exit it runs too, whoever started the ranks (torch.multiprocessing.spawn, torchrun): a
  callback of ours left pending into the interpreter's teardown aborts the process
  ("terminate called without an active exception") when its collective completes there.
"""
import atexit
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import torch
import torch.distributed as dist

from dist_sgd.plumbing.launch import before_leaving

# ---- one order of collectives per process -------------------------------------------------
# A DDP bucket's plain all-reduce is issued when the bucket is launched, in bucket order: the
# same on every rank. But a communication hook may issue more collectives later, from a
# callback of its first one (PowerSGD: the P's once the vectors are summed, the Q's once the
# P's are), on whichever thread finished that. Meanwhile backward launches the next bucket on
# the main thread: one rank issues "bucket 0's Q, bucket 1's vectors", its peer the reverse,
# and gloo pairs two messages of different sizes (it aborts: "Received data size doesn't match
# expected size"). So every such collective goes through one chain per process: the next
# starts only once the previous has issued everything it will issue.
_tail = torch.futures.Future()  # done when the last start queued has issued all it will
_tail.set_result(None)
_tail_lock = threading.Lock()
_used = False  # whether this process started anything here (the exit has work only then)
_starting = threading.local()  # set while a start runs: an in_order call inside it is part of it


def in_order(start, later=True):
    """Call start() -> Future once every earlier in_order call has issued all its collectives;
    returns a Future of start's Future's value (a failure in start is that Future's error).

    later=True: start may issue more collectives until its Future is done (a comm hook), so
    the next call waits for that. later=False: start issues everything before it returns (one
    plain all-reduce), so the next may follow at once and plain buckets still overlap.
    A call made while a start is running (a hook that orders itself, inside our DDP's chain)
    runs at once: it is part of that start."""
    global _tail, _used
    _used = True
    if getattr(_starting, "active", False):
        return start()
    result, issued = torch.futures.Future(), torch.futures.Future()
    with _tail_lock:
        previous, _tail = _tail, (result if later else issued)

    def run(_):
        _starting.active = True
        try:
            future = start()
        except BaseException as error:  # noqa: BLE001 - the caller's wait() raises it
            result.set_exception(error)
            return
        finally:
            _starting.active = False
            issued.set_result(None)
        future.add_done_callback(lambda f: _pass_on(f, result))

    previous.add_done_callback(run)  # at once when previous is done; else when it is
    return result


def _pass_on(future, result):
    try:
        result.set_result(future.value())
    except BaseException as error:  # noqa: BLE001
        result.set_exception(error)


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
    global _used
    _used = True
    if all_reduce is None or all_reduce is dist.all_reduce:
        work = dist.all_reduce(tensor, async_op=True)
        _callbacks.begin()
        return work.get_future().then(_first_tensor)
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


def _first_tensor(fut):
    """all_reduce's Future holds a list of tensors: its one tensor (counted as run)."""
    try:
        return fut.value()[0]
    finally:
        _callbacks.end()


class _Pending:
    """How many of our callbacks on torch's futures have yet to run (settle waits for 0)."""

    def __init__(self):
        self.count, self.zero = 0, threading.Condition()

    def begin(self):
        with self.zero:
            self.count += 1

    def end(self, value=None):
        with self.zero:
            self.count -= 1
            self.zero.notify_all()
        return value

    def wait(self, timeout):
        with self.zero:
            return self.zero.wait_for(lambda: self.count == 0, timeout)


_callbacks = _Pending()


@before_leaving
def settle(timeout=None):
    """Wait (up to `timeout` seconds in all; None: no limit) until nothing started here still
    runs on another thread: the in_order chain has issued everything (its last start's Future,
    with its callbacks, is done) and the helper thread has run every job given to it (one
    FIFO thread: a no-op submitted now runs after them). Raises TimeoutError if not."""
    end = None if timeout is None else time.monotonic() + timeout
    left = lambda: None if end is None else max(0.0, end - time.monotonic())  # noqa: E731
    with _tail_lock:
        tail = _tail
    chained = threading.Event()
    tail.add_done_callback(lambda _: chained.set())  # at once if done already
    if not chained.wait(left()):
        raise TimeoutError("the collectives started in order had not all been issued")
    if not _callbacks.wait(left()):
        raise TimeoutError("an all-reduce started by start_all_reduce had not finished")
    with _launcher_lock:
        launcher = _launcher
    if launcher is not None:
        try:
            launcher.submit(lambda: None).result(left())
        except FutureTimeout:
            raise TimeoutError("the helper thread was still running an all-reduce") from None
        except RuntimeError:  # at exit: the thread was joined already, its jobs all run
            pass


EXIT_TIMEOUT = 60.0  # seconds the end of the process waits for our work still in flight


@atexit.register
def _settle_at_exit():
    """At the interpreter's exit (after Python's threads were joined, before its teardown): let
    our callbacks still pending on torch's futures run now, while Python can still run them.
    A callback that signalled us may still be on its way out of Python on torch's thread: a
    group left up is destroyed here too, which joins its threads (the group ends at exit
    anyway; one the script destroyed itself has no thread left)."""
    if not _used:
        return
    try:
        settle(EXIT_TIMEOUT)
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception as error:  # noqa: BLE001 - reported, never raised at exit
        print(f"warning: work still in flight at exit: {error}", file=sys.stderr, flush=True)
