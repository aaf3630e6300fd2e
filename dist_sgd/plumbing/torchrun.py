"""The torchrun path: this process already is one rank (RANK, WORLD_SIZE, MASTER_ADDR set by
torchrun or a cluster launcher), so launch() joins the group it describes, runs fn here, and the
ranks' results meet in the launcher's store, which outlives every operation's timeout.
"""
import datetime
import os
import pickle
import sys
import threading
import time
import traceback
import warnings

import torch
import torch.distributed as dist

from dist_sgd.plumbing.blame import _from_torch_distributed, _returned_early
from dist_sgd.plumbing.leave import _leave_group, _settle
from dist_sgd.plumbing.rank import default_backend
from dist_sgd.plumbing.rendezvous import _init

_WAIT_FOR_PEERS = datetime.timedelta(days=30)  # "as long as they work": the launcher watches


def _launcher_store(rank, timeout):
    """A client of the store torchrun's agent hosts at MASTER_ADDR:MASTER_PORT; without an
    agent (a cluster launcher), rank 0 hosts it there, as env:// would."""
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                         is_master=rank == 0 and not agent, multi_tenant=True,
                         timeout=datetime.timedelta(seconds=timeout))


def _run_here(fn, world_size, args, backend, timeout, threads):
    """torchrun made this process a rank already: join the group it describes and run fn.
    The results meet in the launcher's store, which outlives every operation's timeout."""
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if dist.is_initialized():
        raise RuntimeError("launch() found a process group already initialized in this process; "
                           "it creates its own: call dist.destroy_process_group() first")
    if world_size not in (None, size) and rank == 0:
        print(f"note: running under torchrun with WORLD_SIZE={size}; "
              f"ignoring the requested world size {world_size}", flush=True)
    backend = backend or default_backend(int(os.environ.get("LOCAL_WORLD_SIZE", size)))
    # As spawned ranks: a plain RANK=... start has no OMP_NUM_THREADS.
    torch.set_num_threads(threads)
    store = _launcher_store(rank, timeout)
    # Each launch() in this process gets keys of its own: a store keeps the keys of earlier
    # groups, and a new group that read them would try to connect to the old one. The agent's
    # shared store also outlives a restart (torch 2.14.1: see dist_sgd.faults.restarts), so
    # there the keys carry the attempt too. With TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 every
    # round has a fresh store and needs no attempt in its keys, which is what elastic runs
    # need: a node that joins later counts its restarts from 0.
    shared = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    run = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") if shared else "-"
    call = store.add(f"dist_sgd/{run}/calls/{rank}", 1)
    store = dist.PrefixStore(f"dist_sgd/{run}/{call}/", store)
    _init(rank, size, backend, timeout, store=dist.PrefixStore("group/", store))
    exiting = None
    try:
        try:
            result = fn(rank, size, *args)
        except SystemExit as e:  # sys.exit(0): deliver None, then exit as asked
            if e.code not in (None, 0):
                raise
            result, exiting = None, e
        except Exception as e:
            if _from_torch_distributed(e):  # a peer that returned already left its result here
                for line in _returned_early(_finished_peers(store, rank, size), rank):
                    print(f"[rank {rank}] {line}", file=sys.stderr, flush=True)
                # A peer, or the host of the group's store, may be gone (a lost node): leaving
                # the group or exiting normally could wait on its sockets for minutes. Say why
                # and go, as a spawned rank does; torchrun sees the failure and restarts.
                traceback.print_exc()
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(1)
            raise
        results = _meet(store, rank, size, result)
        _settle(timeout)  # torchrun's process goes on (and tears down): nothing may be in flight
    finally:
        _leave_group()
    if exiting is not None:
        raise exiting
    return results


def _finished_peers(store, rank, size, wait=2.0):
    """The ranks that left a result in the store, asked for at most `wait` seconds: when the
    store's host is gone (a lost node) a TCP request can block for minutes, so we stop asking."""
    found = []
    asking = threading.Thread(target=lambda: found.extend(
        r for r in range(size) if r != rank and store.check([f"result/{r}"])), daemon=True)
    asking.start()
    asking.join(wait)
    return list(found) if not asking.is_alive() else []


def _meet(store, rank, size, result):
    """Every rank hands rank 0 its result through the store; each waits (no time limit: a
    busy peer is no error, and torchrun ends the job if a rank fails) until all are done."""
    wait = _WAIT_FOR_PEERS
    if rank != 0:
        try:
            data = pickle.dumps(result)
        except Exception as e:  # noqa: BLE001
            data = pickle.dumps(_Unpicklable(f"{type(result).__name__}: {e}"))
        store.set(f"result/{rank}", data)
        store.wait(["released"], wait)
        store.add("left", 1)  # rank 0 may host the store: it waits for this before leaving
        return None
    keys = [f"result/{r}" for r in range(1, size)]
    if keys:
        store.wait(keys, wait)
    results = [result] + [pickle.loads(store.get(k)) for k in keys]
    for k in keys:
        store.delete_key(k)
    store.set("released", b"1")
    end = time.monotonic() + 30
    while store.add("left", 0) < size - 1 and time.monotonic() < end:
        time.sleep(0.01)
    for r, value in enumerate(results):
        if isinstance(value, _Unpicklable):
            warnings.warn(f"rank {r} returned a value that cannot be sent back ({value.why}); "
                          "its entry in the results is None", RuntimeWarning)
            results[r] = None
    return results


class _Unpicklable:
    def __init__(self, why):
        self.why = why
