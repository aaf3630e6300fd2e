"""Lesson 01: processes and process groups.

Data-parallel training runs one copy of the training loop per *process* (a "rank"), usually
one per GPU or, here, one per CPU core. Processes share nothing, not even the interpreter's
GIL; before they can exchange a single tensor they must find each other and agree on who is
who. That meeting is `torch.distributed.init_process_group(backend, init_method, rank,
world_size)`, and its result, the *process group*, is what every later send, receive and
all-reduce goes through.

What this lesson does:
  1. starts N processes itself with multiprocessing, as PyTorch's tutorial does, and in each
     calls the tutorial's init_process(rank, size, fn): init_process_group, fn, leave. It
     joins a group with each of the three init methods in turn:
       env://   MASTER_ADDR / MASTER_PORT (and RANK / WORLD_SIZE) come from the environment
                (what torchrun and most cluster launchers set; rank 0 hosts a small
                key-value store at that address where the others register),
       tcp://   the same store, its address written into the URL: tcp://10.0.0.1:23456
                (each process is told its rank and the world size explicitly),
       file://  a file on a filesystem every rank can see (NFS on a cluster): ranks
                register by writing to it; it must not exist beforehand.
     In the group each rank prints who it is, waits at a barrier (nobody passes until all
     have arrived) and checks the group with one all-reduce;
  2. does the same with dist_sgd.plumbing.launch.launch(), and shows what it adds: a free port
     chosen by the kernel (never a fixed one), a timeout on every operation (torch's
     default is 30 minutes for gloo, 10 for NCCL: a lost rank would stall its peers that
     long), every rank's result back by rank, and, when one rank fails, an error naming
     it; no process is left behind.
Under torchrun the processes exist already: torchrun started them and set the env://
variables, so step 1 is one init_process with env:// in each of them.

Run it (from the repository root):
    python lessons/01_process_groups.py --world-size 4
    torchrun --standalone --nproc-per-node 2 lessons/01_process_groups.py
(--standalone lets torchrun pick a free port instead of the fixed 29500.)

Exercises:
  1. Run with --world-size 1: is a group of one useful? (Yes: the same script must also
     run on one machine; collectives become copies.)
  2. In run's "fail" part, replace the raise with time.sleep(600): what reports the
     problem, and after how long? (Hint: the `timeout` argument of launch.)
  3. Start the same file twice by hand with env://: in two shells set MASTER_ADDR=127.0.0.1,
     MASTER_PORT=<a free port>, WORLD_SIZE=2 and RANK=0 / RANK=1, then run it.
  4. Which init method would you use on a cluster with no shared filesystem? Without DNS?
"""
import datetime
import multiprocessing as mp
import os
import shutil
import tempfile
import time

import torch
import torch.distributed as dist

from dist_sgd.plumbing.check import check
from dist_sgd.plumbing.launch import RankError, free_port, launch, lesson_parser
from dist_sgd.plumbing.rank import device, log, rank_print, under_torchrun

BACKENDS = """\
Backends: the library that moves the bytes.
  gloo  CPU tensors (and GPU tensors, staged through the CPU); ships with torch everywhere.
        Use it for CPU training and for tests. This lesson's step 1 uses it.
  nccl  NVIDIA's GPU-to-GPU library (NVLink, InfiniBand, GPUDirect); one GPU per process.
        Use it for all GPU training: it is many times faster than gloo there.
  mpi   whatever MPI the cluster has; only when torch was built from source against it and
        the job is started by mpirun.
Available here: """


def run(rank, size, part):
    """What every rank does inside the group: part names how the group was joined, or, for
    part "fail", the last rank gives up while the others wait for it at a barrier."""
    if part == "fail":
        dist.barrier()
        if rank == size - 1:
            raise RuntimeError(f"rank {rank} gives up on purpose")
        dist.barrier()  # the others wait here for a rank that will never come
    rank_print(f"{part}: I am rank {dist.get_rank()} of {dist.get_world_size()} "
               f"(backend {dist.get_backend()}, pid {os.getpid()})")
    dist.barrier()  # nobody passes until all ranks have arrived
    total = torch.tensor([rank + 1.0], device=device())  # rank r contributes r + 1 ...
    dist.all_reduce(total)  # ... and every rank receives the sum 1 + 2 + ... + size
    expected = size * (size + 1) / 2
    log(check(f"{part} all-reduce of rank+1 vs N(N+1)/2 = {expected:g}",
              abs(total.item() - expected), 0))
    return total.item()


def init_process(rank, size, fn, init_methods, port=None):
    """The tutorial's init_process(rank, size, fn, backend), for each init method in turn."""
    if port is not None:  # env:// reads rank 0's address from the environment
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    for url in init_methods:
        dist.init_process_group("gloo", init_method=url, rank=rank, world_size=size,
                                timeout=datetime.timedelta(seconds=60))  # default: 30 min
        fn(rank, size, url.split("//")[0] + "//")
        dist.barrier()  # leave together: rank 0 hosts the store the others may still use
        dist.destroy_process_group()


def start_processes(size):
    """Step 1: N processes, each one rank, started here (a fresh interpreter each)."""
    workdir = tempfile.mkdtemp()  # file:// needs a path that does not exist yet
    urls = ["env://", f"tcp://127.0.0.1:{free_port()}", f"file://{workdir}/rendezvous"]
    port = free_port()  # for env://: a port nobody uses now, picked by the kernel
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=init_process, args=(rank, size, run, urls, port))
             for rank in range(size)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()  # no timeout here: if a rank hung, so would we
    shutil.rmtree(workdir)
    codes = [p.exitcode for p in procs]
    log(f"exit codes by rank: {codes} (all we learn about the ranks from here)")
    if any(codes):
        raise SystemExit(f"a rank failed: exit codes {codes}")


def main():
    args = lesson_parser(__doc__).parse_args()
    log(BACKENDS + ", ".join(f"{b}={getattr(dist, f'is_{b}_available')()}"
                             for b in ("gloo", "nccl", "mpi")))
    started_here = not under_torchrun()
    if started_here:
        log(f"\n--- 1. {args.world_size} processes started here, joined 3 ways ---")
        start_processes(args.world_size)
    else:
        log("\n--- 1. torchrun started the processes and set MASTER_ADDR, MASTER_PORT, "
            "RANK, WORLD_SIZE: env:// reads them ---")
        init_process(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), run, ["env://"])

    log("\n--- 2. the same with launch(fn, world_size, *args) ---")
    start = time.perf_counter()
    results = launch(run, args.world_size, "launch()", backend=args.backend)
    if results is not None:  # in the process that reports (the parent, or torchrun's rank 0)
        log(f"every rank's result, by rank: {results} ({time.perf_counter() - start:.1f} s)")
    if not started_here:
        log("(under torchrun a failing rank ends the whole job: torchrun stops the others. "
            "Run without torchrun to see launch() name the failed rank.)")
        return
    log(f"\n--- a rank that fails: rank {args.world_size - 1} raises, the others wait at a "
        "barrier ---")
    start = time.perf_counter()
    try:
        launch(run, args.world_size, "fail", backend=args.backend)
        raise AssertionError("the failing launch did not fail")
    except RankError as e:
        lines = str(e).splitlines()
        log(f"launch() raised RankError after {time.perf_counter() - start:.1f} s; "
            f"e.rank = {e.rank}; the message starts:")
        log("\n".join("    " + line[:150] for line in lines[:3]))
        log(f"    ... ({len(lines) - 3} more lines: the failed rank's traceback; "
            f"e.tracebacks holds every failed rank's)")
    log(f"processes left behind: {len(mp.active_children())}. By hand (step 1), the others "
        "would wait at that barrier until the group's timeout, and we would see only exit "
        "codes.")


if __name__ == "__main__":
    main()
