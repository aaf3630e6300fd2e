"""A rank that returns with our all-reduce still in flight, started without launch().

Rank 0 starts an in-order all-reduce (a Python callback of ours waits on torch's Future) and
returns at once, before rank 1 has even started its half: the process ends with the callback
pending. When the all-reduce completes during the interpreter's teardown, a gloo thread runs
Python there and the process aborts ("terminate called without an active exception"), unless
the library lets its work finish at exit (dist_sgd.comm.ordered's atexit). Run as

    python3 tests/exit_trigger.py                                         # torch.multiprocessing
    python3 -m torch.distributed.run --standalone --nproc-per-node 2 tests/exit_trigger.py
"""
import os
import socket
import sys
import time

import torch
import torch.distributed as dist


def rank_fn(rank, world_size, port=None):
    if port is not None:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    from dist_sgd.comm.ordered import in_order, start_all_reduce
    if rank == 1:
        time.sleep(1.0)  # rank 0 has returned and is exiting by now
    pending = in_order(lambda: start_all_reduce(torch.ones(4)))
    if rank == 1:
        assert pending.wait().tolist() == [2.0] * 4
    sys.stdout.write(f"rank {rank}: returns\n")
    sys.stdout.flush()


if __name__ == "__main__":
    if "RANK" in os.environ:  # under torchrun: this process is one rank
        rank_fn(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
    else:
        import torch.multiprocessing as mp
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            free = s.getsockname()[1]
        mp.spawn(rank_fn, args=(2, free), nprocs=2)
