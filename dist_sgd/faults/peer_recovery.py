"""Recovery from a live peer, by hand (the idea of torchft): no restart, no checkpoint read.

When a rank dies, synchronous SGD cannot just re-assign its work: every step needs every
rank. Checkpoint-restart (dist_sgd.faults.checkpoint + torchrun --max-restarts) stops everyone,
starts everyone again and recomputes the steps since the last checkpoint. Here instead:

1. The survivors keep their state in memory. Their next collective fails (the dead rank's
   connections are closed), they catch that error and leave the broken process group.
2. A supervisor (the parent process, which also hosts the rendezvous store) saw the rank die,
   starts a replacement with the same rank, and announces a new *generation*.
3. Everyone (survivors and replacement) forms a fresh process group for that generation,
   through the same store under a new key prefix, so old and new messages never mix.
4. The ranks agree on who holds the newest state (the highest step) and that rank sends its
   weights, optimizer state and step to all others: the replacement catches up from a peer.
   Training goes on from there; at most the step that failed is done again.

How a training function takes part: run_with_peer_recovery's docstring. Only gloo on one
machine here; the same shape works across nodes with a shared store.
"""
import datetime
import os
import pickle
import signal
import time
import traceback

import torch
import torch.distributed as dist

from dist_sgd.plumbing.launch import GRACE, Ranks, free_port, rank_error


class PeerGroup:
    """This rank's membership in a process group that can be re-formed after a failure."""

    # What a collective raises when a peer's connections close: gloo raises a plain
    # RuntimeError ("Connection reset by peer"), so a bug would look the same; recover() tells
    # them apart by waiting for the supervisor, who only announces a generation when a rank died.
    FAILURES = (RuntimeError,)

    def __init__(self, store, rank, world_size, generation, backend="gloo", timeout=30.0):
        self.store, self.rank, self.world_size = store, rank, world_size
        self.generation, self.backend, self.timeout = generation, backend, timeout

    def join(self):
        """Form the process group of the current generation, under its own key prefix."""
        prefixed = dist.PrefixStore(f"generation-{self.generation}/", self.store)
        dist.init_process_group(self.backend, store=prefixed, rank=self.rank,
                                world_size=self.world_size,
                                timeout=datetime.timedelta(seconds=self.timeout))

    def sync(self, state):
        """Everyone ends with the state of the rank that is furthest ahead (lowest rank among
        equals). `state` is any picklable object with a "step" entry (None = nothing yet)."""
        steps = [None] * self.world_size
        dist.all_gather_object(steps, -1 if state is None else state["step"])
        src = max(range(self.world_size), key=lambda r: (steps[r], -r))
        box = [state if self.rank == src else None]
        dist.broadcast_object_list(box, src=src)
        self.store.set(f"resumed/{self.generation}/{self.rank}", repr(time.time()))
        return box[0]

    def recover(self, state, error):
        """After a failed collective: leave the broken group, wait for the supervisor's next
        generation, join it, and take the newest state from a peer. When no rank died (the
        supervisor announces nothing), `error` was a bug of our own: raise it."""
        self.store.set(f"failed/{self.generation}/{self.rank}", repr(time.time()))
        self.store.add(f"failures/{self.generation}", 1)  # the supervisor watches this count
        dist.destroy_process_group()
        self.generation += 1
        key = f"generation/{self.generation}"
        self.store.wait([key], datetime.timedelta(seconds=self.timeout))
        if self.store.get(key) == b"abort":  # nobody died: the error was a bug, report it
            raise error
        self.join()
        return self.sync(state)

    def progress(self, step):
        """Tell the supervisor how far training is (it uses this to pick when to kill)."""
        if self.rank == 0:
            self.store.set("progress", str(step))


def state_of(model, optimizer, step):
    """What a rank offers its peers: weights (a DDP wrapper's inner model), optimizer, step."""
    return {"step": step, "model": getattr(model, "module", model).state_dict(),
            "optimizer": optimizer.state_dict()}


_GROUP = None  # this process's PeerGroup, inside run_with_peer_recovery


def current_group():
    """The PeerGroup of this rank (only inside a function run_with_peer_recovery runs)."""
    if _GROUP is None:
        raise RuntimeError("current_group() works inside a function run by run_with_peer_recovery")
    return _GROUP


def _child(fn, rank, world_size, port, generation, args, env, op_timeout, conn):
    global _GROUP
    os.environ.clear()
    os.environ.update(env)
    torch.set_num_threads(1)
    try:
        store = dist.TCPStore("127.0.0.1", port, is_master=False,
                              timeout=datetime.timedelta(seconds=60))
        _GROUP = group = PeerGroup(store, rank, world_size, generation, timeout=op_timeout)
        group.join()
        result = fn(rank, world_size, *args)
        dist.barrier()  # nobody leaves while a peer still needs the group
        dist.destroy_process_group()
        conn.send_bytes(pickle.dumps(("ok", result)))
    except BaseException as e:  # noqa: BLE001 - report everything to the supervisor
        conn.send_bytes(pickle.dumps(("failed", "error", f"{type(e).__name__}: {e}",
                                      traceback.format_exc())))
        os._exit(1)


def run_with_peer_recovery(fn, world_size, args=(), kill=None, max_replacements=3, timeout=120,
                           op_timeout=30.0):
    """Run fn(rank, world_size, *args) on world_size ranks (current_group() is the rank's
    PeerGroup there); replace a rank that dies, up to
    max_replacements times. kill=(rank, step) kills that rank (SIGKILL) once rank 0 reported
    that step: the failure the lesson and the tests inject. op_timeout: seconds a rank's
    collective may wait for a peer that went silent (a dead peer's closed connections usually
    fail it at once; this bounds the rare wait when they do not). Returns (results by rank,
    events): events holds the times of each kill, replacement and resume, for measuring
    recovery. The ranks are launch()'s (dist_sgd.plumbing.launch.Ranks): started, watched and
    blamed the same way; what differs is the policy: a rank that dies is started again.

    results, events = run_with_peer_recovery(run, world_size=3, args=(...), kill=(1, 40))
    def run(rank, world_size, *args):  # as launch() calls it
        group = current_group()        # this rank's PeerGroup
        ...; state = group.sync(state)  # after joining: take the newest state from a peer
        while step < steps:
            try: one_step(); group.progress(step)
            except group.FAILURES as e: state = group.recover(state, e)  # re-form, sync
    """
    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=timeout))
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", WORLD_SIZE=str(world_size))
    ranks, generation, events = Ranks(), 0, []

    def start(rank):
        ranks.start(rank, _child, fn, rank, world_size, port, generation, args,
                    dict(env, RANK=str(rank)), op_timeout)

    for rank in range(world_size):
        start(rank)
    results, deadline, failed_since, errors = {}, time.monotonic() + timeout, None, {}
    try:
        while len(results) < world_size:
            # Ranks report failed collectives; if no rank died within GRACE seconds of the
            # first report, the failure was a bug, not a dead peer: abort instead of recovering.
            if failed_since is None and int(store.add(f"failures/{generation}", 0)) > 0:
                failed_since = time.monotonic()
            if failed_since is not None and time.monotonic() - failed_since > GRACE:
                store.set(f"generation/{generation + 1}", "abort")
                failed_since = float("inf")
            if errors and (len(errors) + len(results) == world_size or
                           time.monotonic() - min(errors.values())[0] > GRACE):
                raise _blame(store, generation, errors,
                             [r for r in ranks.procs if r not in results and r not in errors])
            if time.monotonic() > deadline:
                raise TimeoutError(f"ranks {sorted(set(ranks.procs) - set(results))} did not "
                                   f"finish within {timeout} s")
            if kill and _reached(store, kill[1]):
                os.kill(ranks.procs[kill[0]].pid, signal.SIGKILL)
                events.append(("killed", kill[0], time.time()))
                kill = None
            running = [r for r in ranks.procs if r not in results and r not in errors]
            for rank, outcome in ranks.wait(running, timeout=0.01).items():
                if outcome[0] == "ok":
                    results[rank] = outcome[1]
                elif outcome[0] == "failed":
                    errors[rank] = (time.monotonic(), *outcome[2:])
                else:  # died: the replacement joins the next generation
                    if max_replacements <= 0:
                        raise RuntimeError(f"rank {rank} {outcome[1]} and no replacements "
                                           "are left")
                    max_replacements -= 1
                    generation, failed_since = generation + 1, None
                    ranks.stop(rank)
                    start(rank)
                    store.set(f"generation/{generation}", "1")
                    events.append(("replaced", rank, time.time()))
        events += _resume_times(store, generation, world_size)
        return [results[r] for r in range(world_size)], events
    finally:
        ranks.stop()


def _blame(store, generation, errors, pending):
    """launch()'s RankError, each rank that raised classed by the store: one that raised with
    no failed collective reported is its own code's error; the others are symptoms, in the
    order their collectives failed."""
    def first_failure(rank):
        key = f"failed/{generation}/{rank}"
        return float(store.get(key)) if store.check([key]) else float("-inf")
    failures = {r: ("error" if first_failure(r) == float("-inf") else "symptom", *errors[r][1:])
                for r in sorted(errors, key=first_failure)}
    return rank_error(failures, pending)


def _reached(store, step):
    return store.check(["progress"]) and int(store.get("progress")) >= step


def _resume_times(store, generation, world_size):
    out = []
    for g in range(1, generation + 1):
        for r in range(world_size):
            key = f"resumed/{g}/{r}"
            if store.check([key]):
                out.append(("resumed", r, float(store.get(key))))
    return out
