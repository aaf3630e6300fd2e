"""Who am I? The few facts every rank asks, and how a rank prints.

    rank, world_size = world("average_gradients")   # or a clear error outside a group
    log("only rank 0 prints this")
    rank_print("every rank prints this, as [rank r] ...")
    x = x.to(device())                               # this rank's GPU under NCCL, else the CPU

Everything else in dist_sgd may import this module; it imports nothing of dist_sgd.
"""
import os
import sys

import torch
import torch.distributed as dist

# launch() marks the environment it gives its own ranks, so that RANK / WORLD_SIZE it set
# are never mistaken for a launcher's (a rank that calls launch() again spawns afresh).
SPAWNED = "DIST_SGD_SPAWNED"


def under_torchrun():
    """True when a launcher (torchrun, or a cluster's) already made this process one rank."""
    env = os.environ
    return SPAWNED not in env and all(k in env for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR",
                                                         "MASTER_PORT"))


def world(what=None, group=None):
    """(rank, world_size) in `group` (default: the default group).

    Outside a process group: (0, 1), a single process, when `what` is None; otherwise a
    RuntimeError saying that `what` needs a group and how to get one.
    """
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(group), dist.get_world_size(group)
    if what is None:
        return 0, 1
    raise RuntimeError(f"{what} needs a process group: run it inside "
                       "dist_sgd.plumbing.launch.launch(...) or a script started by torchrun")


def rank():
    """This process's rank: from the group; else from RANK when a launcher (or launch) set it
    (a rank before or after its group exists); else 0 (a plain process)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ["RANK"]) if under_torchrun() or SPAWNED in os.environ else 0


def default_backend(local_world_size=1):
    """NCCL when every local rank can have a GPU of its own, gloo otherwise."""
    n_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n_gpus >= (local_world_size or 1) and dist.is_nccl_available():
        return "nccl"
    return "gloo"


def device():
    """The device this rank computes on: its own GPU under NCCL, the CPU under gloo."""
    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")


def log(*args, **kwargs):
    """print() from rank 0 only (or from a process that is no rank, like the launcher)."""
    if rank() == 0:
        print(*args, **kwargs, flush=True)


def rank_print(*args, **kwargs):
    """print() from every rank, prefixed with [rank r]: for output that differs per rank."""
    sep, end = kwargs.pop("sep", " "), kwargs.pop("end", "\n")
    # One write per line, newline included: ranks share the terminal, and print() writes the
    # text and the newline separately, so two ranks' lines could run together.
    file = kwargs.pop("file", None) or sys.stdout
    file.write(sep.join([f"[rank {rank()}]"] + [str(a) for a in args]) + end)
    file.flush()
