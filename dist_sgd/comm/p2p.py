"""Point-to-point timing: a ping-pong between ranks 0 and 1, measured carefully.

    rows = ping_pong([8, 1024, 2**20])        # ranks 0 and 1 bounce messages; all ranks get rows

Lesson 02 writes send/recv, isend/irecv and a ping-pong by hand; this is the same ping-pong
made into a measurement (interleaved sizes, medians, a check that the bytes came back
unchanged), reused by lesson 04 and the benchmark. exchange_cpu measures the other cost of a
message: the CPU it burns (the cost model's share of the machine, dist_sgd.scale.costmodel).
"""
import os
import statistics
import time

import torch
import torch.distributed as dist

from dist_sgd.plumbing.rank import device
from dist_sgd.plumbing.timing import summarize, time_alternating


def ping_pong(sizes_bytes, repeats=10, warmup=2, min_sample_seconds=5e-3):
    """Measure one-way message time between ranks 0 and 1 for each size in `sizes_bytes`.

    Rank 0 sends n bytes to rank 1, which sends them straight back: a round trip is two
    messages, so one-way time = round trip / 2. Call it on every rank of a group of two or
    more (ranks other than 0 and 1 only join the timing barriers). Returns, on every rank, one
    dict per size: {"bytes", "seconds" (one-way, median), "min", "max", "bandwidth" (bytes/s,
    from the median)}.

    Timing goes through dist_sgd.plumbing.timing.time_alternating with one candidate per message
    size:
    sizes are interleaved, so a burst of load on this shared machine hits every size, not one.
    Each sample starts after a barrier, whose exit can be skewed between ranks by about one
    message latency; to keep that out of the numbers, a sample repeats the round trip until
    it lasts about `min_sample_seconds` (many times for 8 bytes, once for megabytes) and is
    divided by the count.
    """
    rank, size = dist.get_rank(), dist.get_world_size()
    if size < 2:
        raise ValueError(f"ping_pong needs a group of at least 2 ranks, this one has {size}")
    sizes = [int(n) for n in sizes_bytes]
    if not sizes or any(n < 1 or n != s for n, s in zip(sizes, sizes_bytes)):
        raise ValueError(f"sizes_bytes must be positive whole numbers of bytes, "
                         f"got {sizes_bytes!r}")
    buffers = {n: torch.zeros(n, dtype=torch.uint8, device=device()) for n in sizes}
    payload = {n: torch.arange(n, dtype=torch.int64, device=device()).remainder(251).to(torch.uint8)
               for n in sizes}

    def round_trips(n, count):
        buf = buffers[n]
        for _ in range(count):
            if rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            elif rank == 1:
                dist.recv(buf, 0)
                dist.send(buf, 0)

    # How many round trips make one sample last ~min_sample_seconds: time a few, agree on it
    # (time_alternating returns the same numbers on every rank, so the counts match).
    probes = time_alternating({n: (lambda n=n: round_trips(n, 1)) for n in sizes},
                              repeats=3, warmup=1)
    counts = {n: max(1, min(1000, round(min_sample_seconds / max(summarize(probes[n])["median"],
                                                                 1e-9)))) for n in sizes}
    candidates = {n: (lambda n=n: round_trips(n, counts[n])) for n in sizes}
    samples = time_alternating(candidates, repeats=repeats, warmup=warmup)

    # Check the transport, outside the timing: rank 1 must echo exactly what rank 0 sent.
    for n in sizes:
        if rank == 0:
            buffers[n].copy_(payload[n])
        round_trips(n, 1)
        if rank == 0 and not torch.equal(buffers[n].cpu(), payload[n]):
            raise RuntimeError(f"ping_pong: the {n}-byte message came back changed")

    rows = []
    for n in sizes:
        one_way = [s / counts[n] / 2 for s in samples[n]]
        stats = summarize(one_way)
        rows.append({"bytes": n, "seconds": stats["median"], "min": stats["min"],
                     "max": stats["max"], "bandwidth": n / stats["median"]})
    return rows


def machine_cpu_seconds():
    """Seconds this machine's cores have been busy since boot, all of them together (user,
    system, interrupts: every process and the kernel's network work), from /proc/stat; None
    where there is no /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:8]]
    except (OSError, ValueError):
        return None
    busy = sum(fields) - fields[3] - fields[4]  # all but idle and iowait
    return busy / os.sysconf("SC_CLK_TCK")


def exchange_cpu(sizes_bytes, seconds=1.0, rounds=1):
    """CPU seconds one message costs, for each size: ranks 0 and 1 swap n bytes (both send and
    receive at once, through the wire the all-reduces use) and add what arrived into their
    own, a step of the ring or of halving-doubling, for about `seconds` per size. Everything a
    message costs the machine counts: both processes, gloo's threads, the kernel's TCP, the
    shaper, waking up: the busy time of every core (machine_cpu_seconds) over the steps, per
    message (two per step). Only a quiet machine gives the message's own cost; `rounds` sweeps
    of every size, one after another, give each size's median (the daemons of a shared machine
    wake up when they like: one sweep's 64 B cost read 512-981 us in the same minute). Call it
    on every rank of a group of two or more (the others wait); returns on every rank one dict
    per size, {"bytes", "seconds" (CPU seconds per message, less what the idle machine burns
    in as long; the median over the rounds), "min", "max" (over the rounds), "messages" (all
    rounds'), "busy" (the cores' busy share while swapping, the median), "rounds" (each
    round's own dict)}, or [] where the machine's busy time cannot be read."""
    rank, size = dist.get_rank(), dist.get_world_size()
    if size < 2:
        raise ValueError(f"exchange_cpu needs a group of at least 2 ranks, this one has {size}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a positive whole number, got {rounds!r}")
    if machine_cpu_seconds() is None:
        return []
    sizes = [int(v) for v in sizes_bytes]
    sweeps = [_exchange_sweep(sizes, seconds, rank) for _ in range(rounds)]
    rows = []
    for i, n in enumerate(sizes):
        per = [sweep[i] for sweep in sweeps]
        rows.append({"bytes": n, "seconds": statistics.median(r["seconds"] for r in per),
                     "min": min(r["seconds"] for r in per), "max": max(r["seconds"] for r in per),
                     "messages": sum(r["messages"] for r in per),
                     "busy": statistics.median(r["busy"] for r in per), "rounds": per})
    return rows


def _exchange_sweep(sizes, seconds, rank):
    """exchange_cpu's one sweep: a dict per size, from one stretch of swaps each."""
    from dist_sgd.comm.wire import Link

    rows = []
    for n in sizes:
        mine, theirs = torch.ones(max(n // 4, 1)), torch.empty(max(n // 4, 1))  # on the CPU: gloo's

        def swap(count):
            for _ in range(count):
                if rank < 2:
                    Link("exchange").exchange(mine, 1 - rank, theirs, 1 - rank)
                    mine.add_(theirs).mul_(0.5)  # stays 1: no overflow however long it runs
        dist.barrier()
        start = time.perf_counter()
        swap(3)
        # on the CPU: exchange_cpu measures gloo on CPU tensors
        count = torch.tensor([max(5, round(seconds / max((time.perf_counter() - start) / 3,
                                                         1e-6)))])
        dist.broadcast(count, 0)  # the same number of steps on both ranks
        # What the machine burns with nobody sending (daemons, the other ranks' threads),
        # over as long as the steps will take, is taken off the steps' busy time.
        dist.barrier()
        idle, wall = machine_cpu_seconds(), time.perf_counter()
        time.sleep(seconds)
        idle = (machine_cpu_seconds() - idle) / (time.perf_counter() - wall)
        dist.barrier()
        busy, wall = machine_cpu_seconds(), time.perf_counter()
        swap(int(count))
        dist.barrier()
        busy, wall = machine_cpu_seconds() - busy, time.perf_counter() - wall
        messages = 2 * int(count)
        rows.append({"bytes": n, "seconds": max(busy - idle * wall, 0.0) / messages,
                     "messages": messages, "busy": busy / wall / (os.cpu_count() or 1)})
    return rows
