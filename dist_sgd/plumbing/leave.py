"""How a rank leaves its group: work still in flight finished first (before_leaving), the group
destroyed, and a spawned rank's process ended without the interpreter's teardown (where a thread
of torch's that still runs Python would abort it). Used by both launch paths.
"""
import os
import sys

import torch.distributed as dist

from dist_sgd.plumbing.rank import rank as _rank

_BEFORE_LEAVING = []  # what every rank calls once every rank's fn has returned, before leaving


def before_leaving(settle):
    """Have every rank call settle(timeout) after every rank's fn has returned and before it
    leaves the group: a part that can still have work in flight then (a helper thread, Python
    callbacks on torch's threads) lets it finish there, waiting up to `timeout` seconds (the
    group's), so none of it runs while the group is destroyed or the process ends. Registered
    once per function; returns it (usable as a decorator)."""
    if settle not in _BEFORE_LEAVING:
        _BEFORE_LEAVING.append(settle)
    return settle


def _settle(timeout):
    """Every before_leaving function; a failure is reported, never raised (fn's work is done)."""
    for settle in list(_BEFORE_LEAVING):
        try:
            settle(timeout)
        except Exception as e:  # noqa: BLE001
            print(f"[rank {_rank()}] warning: work still in flight when the rank left: {e}",
                  file=sys.stderr, flush=True)


def _end_without_teardown():
    """End this process at once, as the fork server ends every child it forks: no interpreter
    teardown. There, a thread of torch's that wants the GIL (a future's callback on a gloo
    thread, a Python thread inside torch) makes the C++ runtime abort the process."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream has nothing to flush
            pass
    os._exit(0)


def _leave_group():
    """Destroy the group if fn left it up; a failure here is reported, never raised: fn's
    work is done and its result delivered."""
    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001
        print(f"[rank {_rank()}] warning: leaving the process group failed: {e}", file=sys.stderr)
