"""Lesson 01: processes and process groups.

Data-parallel training runs one copy of the training loop per *process* (a "rank"), usually
one per GPU or, here, one per CPU core. Processes share nothing, not even the interpreter's
GIL; before they can exchange a single tensor they must find each other and agree on who is
who. That meeting is `torch.distributed.init_process_group(backend, init_method, rank,
world_size)`, and its result, the *process group*, is what every later send, receive and
all-reduce goes through.

What this lesson does:
  1. starts N processes (dist_sgd.launch spawns them; under torchrun they already exist),
  2. joins them into a group with each of the three init methods in turn:
       env://   MASTER_ADDR / MASTER_PORT / RANK / WORLD_SIZE come from the environment
                (what torchrun and most cluster launchers set; rank 0 hosts a small
                key-value store at that address where the others register),
       tcp://   the same store, its address written into the URL: tcp://10.0.0.1:23456
                (each process is told its rank and the world size explicitly),
       file://  a file on a filesystem every rank can see (NFS on a cluster): ranks
                register by writing to it; it must not exist beforehand,
  3. each rank prints its rank and the world size, waits at a barrier (nobody passes until
     all have arrived), checks the group with one all-reduce, and leaves cleanly
     (the launcher calls barrier() and destroy_process_group() on every rank),
  4. makes one rank fail on purpose and shows what the launcher reports.

Run it (from the repository root):
    python lessons/01_process_groups.py --world-size 4
    torchrun --standalone --nproc-per-node 2 lessons/01_process_groups.py
(torchrun starts the processes itself and sets the env:// variables; --standalone lets it
pick a free port instead of the fixed 29500.)

Exercises:
  1. Run with --world-size 1: is a group of one useful? (Yes: the same script must also
     run on one machine; collectives become copies.)
  2. In fail_one_rank, replace the raise with time.sleep(600): what reports the problem,
     and after how long? (Hint: the `timeout` argument of launch.)
  3. Start the same file twice by hand with env://: in two shells set MASTER_ADDR=127.0.0.1,
     MASTER_PORT=<a free port>, WORLD_SIZE=2 and RANK=0 / RANK=1.
  4. Which init method would you use on a cluster with no shared filesystem? Without DNS?
"""
import multiprocessing as mp
import os
import sys
import time

import torch
import torch.distributed as dist

from dist_sgd.launch import (INIT_METHODS, RankError, device, launch,  # noqa: E402
                             lesson_parser, log, rank_print, under_torchrun)

BACKENDS = """\
Backends: the library that moves the bytes.
  gloo  CPU tensors (and GPU tensors, staged through the CPU); ships with torch everywhere.
        Use it for CPU training and for tests. This laptop run uses it.
  nccl  NVIDIA's GPU-to-GPU library (NVLink, InfiniBand, GPUDirect); one GPU per process.
        Use it for all GPU training: it is many times faster than gloo there.
  mpi   whatever MPI the cluster has; only when torch was built from source against it and
        the job is started by mpirun. Use it where MPI is the only way across the machines.
Available here: """


def hello(rank, world_size, init_method):
    """Runs in every rank, inside an initialized group."""
    rank_print(f"init_method={init_method}: I am rank {dist.get_rank()} of "
               f"{dist.get_world_size()} (backend {dist.get_backend()}, pid {os.getpid()}, "
               f"device {device()})")
    dist.barrier()  # nobody passes until all ranks have arrived
    # Check the group with torch's own all-reduce: rank r contributes r + 1.
    total = torch.tensor([rank + 1.0], device=device())
    dist.all_reduce(total)
    return {"rank": dist.get_rank(), "size": dist.get_world_size(), "sum": total.item()}


def fail_one_rank(rank, world_size):
    dist.barrier()
    if rank == world_size - 1:
        raise RuntimeError(f"rank {rank} gives up on purpose")
    dist.barrier()  # the others wait here for a rank that will never come


def check(results, world_size):
    """The ranks are exactly 0..N-1 and the all-reduce equals its formula N(N+1)/2."""
    assert [r["rank"] for r in results] == list(range(len(results))), results
    assert {r["size"] for r in results} == {world_size}, results
    expected = world_size * (world_size + 1) / 2
    diff = max(abs(r["sum"] - expected) for r in results)
    torch.testing.assert_close(torch.tensor([r["sum"] for r in results]),
                               torch.full((len(results),), expected, dtype=torch.float32))
    return expected, diff


def main():
    args = lesson_parser(__doc__).parse_args()
    if under_torchrun():
        # torchrun made this process a rank and set the env:// variables; launch() joins.
        log("under torchrun: the processes exist already, and the init method is env://")
        results = launch(hello, args.world_size, "env", backend=args.backend)
        size = int(os.environ["WORLD_SIZE"])
        # Only this rank's result comes back here: check it on its own.
        expected = size * (size + 1) / 2
        if int(os.environ["RANK"]) == 0:
            print(f"all-reduce of rank+1 over {size} ranks: {results[0]['sum']:g}, expected "
                  f"{expected:g}, max difference {abs(results[0]['sum'] - expected):g}")
        return
    n = args.world_size
    log(BACKENDS + ", ".join(f"{b}={getattr(dist, f'is_{b}_available')()}"
                             for b in ("gloo", "nccl", "mpi")))
    for method in INIT_METHODS:
        log(f"\n--- {n} processes, init_method={method}:// ---")
        start = time.perf_counter()
        results = launch(hello, n, method, init_method=method, backend=args.backend)
        seconds = time.perf_counter() - start
        expected, diff = check(results, n)
        log(f"every rank returned; all-reduce of rank+1 = {results[0]['sum']:g} on every rank, "
            f"expected {expected:g}: max difference {diff:g}")
        log(f"the whole launch took {seconds:.1f} s" + (
            ": most of it a helper process importing torch once (~1-2 s); the ranks are "
            "forked from it, so the next launches take a fraction of a second" if
            method == INIT_METHODS[0] else ": ranks forked from the helper that imported torch"))
    log(f"\nprocesses left behind after the launches: {len(mp.active_children())}")

    log(f"\n--- a rank that fails: rank {n - 1} raises, the others wait at a barrier ---")
    start = time.perf_counter()
    try:
        launch(fail_one_rank, n, backend=args.backend)
    except RankError as e:
        lines = str(e).splitlines()
        log(f"launch() raised RankError after {time.perf_counter() - start:.1f} s; "
            f"e.rank = {e.rank}; the message starts:")
        log("\n".join("    " + line[:150] for line in lines[:3]))
        log(f"    ... ({len(lines) - 3} more lines: the failed rank's traceback)")
    else:
        raise AssertionError("the failing launch did not fail")
    log(f"processes left behind: {len(mp.active_children())}. Without a launcher that "
        "watches its ranks, the others would wait at that barrier until the group's timeout "
        "(torch's default: 10 to 30 minutes).")


if __name__ == "__main__":
    main()
