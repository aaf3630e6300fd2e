"""Telling a deadlock from a busy machine: the ranks' processes, watched from the launcher.

A timeout on each operation cannot tell them apart: on 2 cores running 20 ranks, a peer that
is only waiting for a core can keep a receive waiting longer than any short timeout, and the
receive fails as if the peer would never answer. Watching the processes can: a rank that
works or waits for a core is running or runnable (state R) and uses CPU time; a rank blocked
on a message sleeps (state S) and uses none. When every rank still running has slept for
`stall` seconds in a row, no one can wake the others: that is a deadlock, caught in the same
time on a quiet machine and on a busy one. Linux only (it reads /proc); elsewhere
`available()` is False and the launcher falls back on a short operation timeout.
"""
import os
import time

_BUSY = set("RD")  # running or runnable; in the kernel on the rank's behalf (a disk read)
# gloo's network thread wakes every 10 ms to poll, deadlock or not: its state says nothing, only
# the CPU time it spends (moving a message) does.
_POLLERS = ("gloo_tcp_loop",)
WORK_NS = 2e6  # a rank's CPU or run-queue time, per sample, above which its threads worked
POLL_SHARE = 0.03  # a poller's share of the time on a core above which it moves data (idle:
# 100 wake-ups a second, well under 1%; moving a message: most of a core)
TICK_NS = 1e9 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)


def available():
    return os.path.isdir(f"/proc/{os.getpid()}/task")


def _read(path):
    with open(path) as f:
        return f.read()


def _sample(pid):
    """(busy: a thread runs or waits for a core, work ns, poll ns, pollers) of process pid;
    None once it has ended. Work: the threads' time on a core and waiting for one (schedstat);
    poll: the pollers' time on a core."""
    busy, work, poll, pollers = False, 0, 0, 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tasks:
        base = f"/proc/{pid}/task/{tid}/"
        try:
            name, fields = _read(base + "comm").strip(), _read(base + "stat").rpartition(")")[2]
            fields = fields.split()
            try:
                on_core, queued = (int(x) for x in _read(base + "schedstat").split()[:2])
            except (OSError, ValueError):  # no schedstat: the ticks utime + stime counted
                on_core, queued = (int(fields[11]) + int(fields[12])) * TICK_NS, 0
        except OSError:  # the thread ended between listing and reading
            continue
        if name in _POLLERS:
            poll += on_core
            pollers += 1
        else:
            busy |= fields[0] in _BUSY
            work += on_core + queued
    return busy, work, poll, pollers


class Stall:
    """Samples processes; stalled(pids) says whether all of them have slept (no thread running
    or waiting for a core, no CPU time used but a poller's idle wake-ups) for `seconds` in a
    row, up to now."""

    def __init__(self, seconds):
        self.seconds, self.since, self.last = seconds, None, None

    def stalled(self, pids):
        now, busy, work, poll, pollers = time.monotonic(), False, 0, 0, 0
        for pid in pids:
            seen = _sample(pid)
            if seen is None:  # ended: the launcher reads how, next round
                busy = True
                continue
            busy |= seen[0]
            work += seen[1]
            poll += seen[2]
            pollers += seen[3]
        if self.last is not None:
            then, was_work, was_poll = self.last
            busy |= abs(work - was_work) > WORK_NS * len(pids) or \
                abs(poll - was_poll) > POLL_SHARE * (now - then) * 1e9 * max(pollers, 1)
        else:
            busy = True
        self.last = (now, work, poll)
        if busy:
            self.since = now
            return False
        return now - self.since >= self.seconds
