"""Side-by-side timing: alternate the things compared, report medians and spread.

These machines are noisy (2 shared cores), so absolute times mean little. Comparing A with
B fairly means measuring them interleaved (A B A B ...) in one run, so that a burst of load
hits both, and reporting medians, which one slow sample cannot move.
"""
import statistics
import time

import torch
import torch.distributed as dist

from dist_sgd.plumbing.rank import device


def _sync():
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()  # GPU work is asynchronous: wait for it before reading the clock


def time_alternating(candidates, repeats=10, warmup=2):
    """Time each of `candidates` ({name: zero-argument callable}) `repeats` times, interleaved.

    Inside a process group every rank must call this with the same candidates: each sample
    starts after a barrier and counts the slowest rank (a distributed step ends when its last
    rank does). Returns {name: [seconds, ...]}, the same on every rank.
    """
    names = list(candidates)
    for _ in range(warmup):
        for name in names:
            candidates[name]()
    samples = {name: [] for name in names}
    for i in range(repeats):
        k = i % len(names)
        for name in names[k:] + names[:k]:  # rotate: nobody always runs first (or last)
            if dist.is_initialized():
                dist.barrier()
            _sync()
            start = time.perf_counter()
            candidates[name]()
            _sync()
            samples[name].append(time.perf_counter() - start)
    if dist.is_initialized():
        for name in names:
            # On this rank's device: NCCL only reduces GPU tensors.
            t = torch.tensor(samples[name], dtype=torch.float64, device=device())
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            samples[name] = t.tolist()
    return samples


def summarize(samples):
    """{'median', 'min', 'max', 'n'} of a list of seconds."""
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples),
            "n": len(samples)}
