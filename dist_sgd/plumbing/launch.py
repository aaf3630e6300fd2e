"""Run one function on N ranks: spawned here, or one rank per process under torchrun.

    results = launch(fn, 4, *args)   # fn(rank, 4, *args) on 4 ranks; results[r] is rank r's value
    if results is not None:          # the process that reports: this one, or torchrun's rank 0
        print(results)

Under torchrun (or a cluster launcher) nothing is spawned: this process *is* one rank
(dist_sgd.plumbing.torchrun), so the same lesson runs on a laptop, on 8 GPUs or on several
nodes. Every rank gets a process group (gloo on CPU, NCCL with one GPU per rank; see
rendezvous) with a timeout on every operation. Nothing waits forever: when a rank raises, dies
or hangs, the launcher stops the others and raises RankError naming the rank that caused it
(blame); with `stall`, a deadlock is seen as every rank asleep (watch). A rank that finished
waits for its peers, lets its work in flight finish, then leaves (leave). This file: spawning
the ranks, watching them and collecting their results.
"""
import atexit
import multiprocessing as mp
import multiprocessing.connection
import os
import pickle
import shutil
import sys
import tempfile
import time
import traceback
import warnings

import torch

from dist_sgd.plumbing import watch
from dist_sgd.plumbing.blame import (GRACE, STALLED, RankError, _blame,  # noqa: F401
                                     _from_torch_distributed, rank_error, stalled_message)
from dist_sgd.plumbing.flags import lesson_parser  # noqa: F401
from dist_sgd.plumbing.leave import (_end_without_teardown, _leave_group, _settle,  # noqa: F401
                                     before_leaving)
from dist_sgd.plumbing.rank import SPAWNED, default_backend, under_torchrun
from dist_sgd.plumbing.rendezvous import INIT_METHODS, _init, free_port, init_url  # noqa: F401
from dist_sgd.plumbing.torchrun import _finished_peers, _run_here  # noqa: F401

# Lessons and tests never need more than this for one operation; real jobs pass their own.
DEFAULT_TIMEOUT = float(os.environ.get("DIST_SGD_TIMEOUT", 120))
PORT_RETRIES = 2  # new ports tried when the store's was taken before rank 0 bound it
START_METHODS = ("forkserver", "spawn")  # "fork" would copy this process's torch state
# torchrun's per-process variables: describe *its* job, so they are not passed on to ours.
_LAUNCHER_VARS = ("GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE")


def _run_fn(fn, rank, world_size, args):
    """fn's result; sys.exit(0) / sys.exit() inside fn ends the rank normally (as under
    torch's launchers), with result None."""
    try:
        return fn(rank, world_size, *args)
    except SystemExit as e:
        if e.code not in (None, 0):
            raise
        return None


def _child(fn, rank, world_size, args, backend, url, timeout, threads, env, conn):
    os.environ.clear()  # the launcher's environment now, not the fork server's from earlier
    os.environ.update(env)
    torch.set_num_threads(threads)  # one process per rank: more threads only fight for cores
    try:
        _init(rank, world_size, backend, timeout, url=url)
        conn.send_bytes(pickle.dumps(("started",)))  # from here on, a rank asleep is waiting
        result = _run_fn(fn, rank, world_size, args)
        # Results travel as plain pickles (copies): torch's shared-memory tensors would vanish
        # with this process. A value pickle cannot copy is no failure (mp.spawn and torchrun
        # ignore return values): it arrives as None, with a warning.
        try:
            conn.send_bytes(pickle.dumps(("ok", result)))
        except Exception as e:  # noqa: BLE001
            conn.send_bytes(pickle.dumps(("ok", None, f"{type(result).__name__}: {e}")))
    except BaseException as e:  # noqa: BLE001 - report everything, KeyboardInterrupt too
        kind = "symptom" if _from_torch_distributed(e) else "error"
        try:
            conn.send_bytes(pickle.dumps(("failed", kind, f"{type(e).__name__}: {e}",
                                          traceback.format_exc())))
        finally:
            os._exit(1)  # skip the teardown: peers may be gone, and nothing must block here
    # Stay in the group until every rank has finished: leaving while a peer is still inside
    # the last collective could cut it off. The launcher closes the pipe when all are done
    # (or when it goes away): no time limit, since a busy peer is no error.
    try:
        conn.recv_bytes()
    except (EOFError, OSError):
        pass
    _settle(timeout)
    _leave_group()
    # Under "spawn" the child would now exit through the interpreter's teardown (the fork server
    # skips it); multiprocessing's own cleanup (joining this process's threads and children)
    # still runs first: atexit comes after it.
    atexit.register(_end_without_teardown)


def _context():
    """How ranks start. "forkserver" (default): one server process imports torch once, and
    each rank is forked from it in milliseconds, instead of a fresh interpreter importing
    torch (~2 s per rank on 2 cores, most of a test's time). The server has run no torch
    code, so it holds no thread pool or CUDA state that a fork could break (forking *this*
    process, which may have, can deadlock). DIST_SGD_START_METHOD=spawn is the plain way."""
    method = os.environ.get("DIST_SGD_START_METHOD", "forkserver")
    if method not in START_METHODS:
        raise ValueError(f"DIST_SGD_START_METHOD must be one of {START_METHODS}, got {method!r}")
    ctx = mp.get_context(method)
    if method == "forkserver":
        # torch._dynamo too: torch's optimizers and DDP import it on first use, 3-4 s of CPU in
        # every rank of every launch; imported once here, it starts no thread.
        ctx.set_forkserver_preload(["torch", "torch.distributed", "torch._dynamo",
                                    "dist_sgd.plumbing.launch"])
    return ctx


def launch(fn, world_size=None, *args, backend=None, init_method="env",
           timeout=DEFAULT_TIMEOUT, threads=1, max_restarts=0, deadline=None, stall=None):
    """Run fn(rank, world_size, *args) on every rank; return the list of results by rank.

    The list (index = rank) comes back in the process that reports: this one when it spawns
    the ranks, global rank 0 under torchrun; every other torchrun process gets None. Results
    must be picklable (one that is not arrives as None, with a warning).
    Raises RankError, naming the rank, when any rank fails; no process is left behind.

    max_restarts: as torchrun's --max-restarts, for the ranks spawned here: when a rank fails,
    every rank is stopped and all are started again, up to max_restarts times; each sees the
    attempt in TORCHELASTIC_RESTART_COUNT (0 first), as under torchrun, so it can resume from
    a checkpoint (lesson 14). Under torchrun, torchrun's own --max-restarts decides.

    deadline: None, or seconds for the whole run of spawned ranks: a rank still running then
    (an endless loop in pure Python, which no operation's timeout sees) is stopped and named
    in the RankError. Under torchrun, torchrun's own watchdogs decide.

    stall: None, or seconds: a deadlock among spawned ranks is caught when every rank still
    running has slept that long (dist_sgd.plumbing.watch), however busy the machine; then
    `timeout` only backs it up. Where the ranks cannot be watched, each operation's timeout
    is `stall` instead (a busy machine may then pass for a deadlock).
    """
    if timeout is None or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if deadline is not None and not deadline > 0:
        raise ValueError(f"deadline must be None or a positive number of seconds, got {deadline!r}")
    if stall is not None and not stall > 0:
        raise ValueError(f"stall must be None or a positive number of seconds, got {stall!r}")
    if not callable(fn):
        raise TypeError(f"fn must be a function, got {fn!r}")
    if under_torchrun():  # no ranks to watch here: a stall is each operation's timeout
        return _run_here(fn, world_size, args, backend, min(timeout, stall or timeout), threads)
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    try:
        pickle.dumps((fn, args))
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"launch() sends fn and its arguments to every rank by pickling them: "
                         f"fn must be a module-level function and args picklable ({e})") from e
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError(f"max_restarts must be an integer >= 0, got {max_restarts!r}")
    backend = backend or default_backend(world_size)
    if stall is not None and not watch.available():
        timeout, stall = min(timeout, stall), None
    attempt, port_taken = 0, 0
    while True:
        try:
            return _spawn(fn, world_size, args, backend, init_method, timeout, threads, attempt,
                          deadline, stall)
        except RankError as e:
            # Another process took the store's port between our pick and rank 0's bind: no
            # rank got past the rendezvous, so starting again on a new port changes nothing.
            tb = e.tracebacks.get(e.rank) or ""
            if "EADDRINUSE" in tb and "in _init\n" in tb and port_taken < PORT_RETRIES:
                port_taken += 1
                continue
            if attempt == max_restarts:
                raise
            attempt += 1
            print(f"launch: {str(e).splitlines()[0]}; restarting all {world_size} ranks "
                  f"(restart {attempt} of {max_restarts})", file=sys.stderr, flush=True)


def _spawn(fn, world_size, args, backend, init_method, timeout, threads, attempt, deadline=None,
           stall=None):
    """One attempt: start world_size ranks here, collect their results, stop them all."""
    workdir = tempfile.mkdtemp(prefix="dist_sgd_")
    url = init_url(init_method, workdir)
    # What a previous run left in os.environ must not matter: our own address and port,
    # ranks, and none of a surrounding torchrun's variables (its agent store is not ours).
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("TORCHELASTIC_") and k not in _LAUNCHER_VARS}
    base.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(world_size),
                LOCAL_WORLD_SIZE=str(world_size), TORCHELASTIC_RESTART_COUNT=str(attempt),
                **{SPAWNED: "1"})
    ranks = Ranks()
    try:
        for rank in range(world_size):
            ranks.start(rank, _child, fn, rank, world_size, args, backend, url, timeout, threads,
                        dict(base, RANK=str(rank), LOCAL_RANK=str(rank)))
        return _collect(ranks, None if deadline is None else time.monotonic() + deadline,
                        None if stall is None else watch.Stall(stall))
    finally:
        ranks.stop()
        shutil.rmtree(workdir, ignore_errors=True)  # the file:// rendezvous, if any


class Ranks:
    """One process per rank, each watched through its pipe: how launch() supervises its ranks,
    and dist_sgd.faults.peer_recovery, which replaces one that dies, too."""

    def __init__(self):
        self.ctx, self.procs, self.conns, self.started = _context(), {}, {}, set()

    def start(self, rank, target, *args):
        """Start target(*args, conn) as `rank`'s process; conn is its end of the pipe, where it
        sends ("ok", result) or ("failed", kind, text, traceback)."""
        here, there = self.ctx.Pipe(duplex=True)
        p = self.ctx.Process(target=target, name=f"rank{rank}", args=(*args, there))
        p.start()
        there.close()
        self.procs[rank], self.conns[rank] = p, here
        self.started.discard(rank)

    def wait(self, ranks, timeout):
        """Wait up to `timeout` seconds for any of `ranks` to report or end. Returns {rank:
        outcome} of those that did: ("ok", result), ("ok", None, why the result could not come
        back), ("failed", kind, text, traceback), or ("died", text) for a rank that ended
        without a word (an exit code of 0 without a result is ("ok", None), as for torch's
        launchers)."""
        mp.connection.wait([self.conns[r] for r in ranks] +
                           [self.procs[r].sentinel for r in ranks], timeout=timeout)
        out = {}
        for r in sorted(ranks):
            msg, closed = None, False
            if self.conns[r].poll():
                try:
                    msg = pickle.loads(self.conns[r].recv_bytes())
                except EOFError:  # pipe closed without a message: the process ended
                    closed = True
                except Exception as e:  # noqa: BLE001 - a result this process cannot unpickle
                    msg = ("ok", None, f"cannot be unpickled here: {e}")
            if msg == ("started",):  # in its group: see _collect's stall
                self.started.add(r)
            elif msg is not None:
                out[r] = msg
            elif closed or not self.procs[r].is_alive():
                if not closed and self.conns[r].poll():
                    continue  # it reported just before exiting: read it next round
                self.procs[r].join(timeout=5)
                code = self.procs[r].exitcode
                how = f"killed by signal {-code}" if code is not None and code < 0 \
                    else f"exit code {code}"
                out[r] = ("ok", None) if code == 0 else \
                    ("died", f"died without reporting a result ({how})")
        return out

    def release(self):
        """Every rank is done: let them leave the group and exit."""
        for c in self.conns.values():
            c.close()
        for p in self.procs.values():
            p.join(timeout=60)

    def stop(self, rank=None):
        """End `rank` (None: every rank) if still running: SIGTERM, then SIGKILL."""
        for c in self.conns.values() if rank is None else [self.conns[rank]]:
            c.close()
        _stop(list(self.procs.values()) if rank is None else [self.procs[rank]])


def _collect(ranks, end=None, stall=None):
    """Wait for every rank's result, then release them all; on a failure, raise RankError.
    end: a time.monotonic() by which every rank must have reported (None: no limit); stall: a
    watch.Stall, which ends the run when every rank still running has slept too long."""
    results, pending = [None] * len(ranks.procs), set(ranks.procs)
    failures, deadline = {}, None  # rank -> (kind, message, traceback), in order of arrival
    while pending and (deadline is None or time.monotonic() < deadline):
        if end is not None and not failures and time.monotonic() > end:
            for r in sorted(pending):  # nobody failed, but these never finished
                failures[r] = ("error", "did not finish before the run's deadline (an endless "
                               "loop, or waiting for a message no peer sends?)", "")
            deadline = time.monotonic()
            break
        # Only ranks in their group count: before, one may sleep waiting for this process
        # (its arguments, on a busy machine) or for a peer's store, which is no deadlock.
        if stall is not None and not failures and pending <= ranks.started and \
                stall.stalled([ranks.procs[r].pid for r in pending]):
            ranks.stop()
            raise RankError(min(pending), stalled_message(sorted(pending), stall.seconds))
        quick = deadline is not None or stall is not None
        for r, outcome in ranks.wait(pending, timeout=0.2 if quick else 1.0).items():
            if outcome[0] == "ok":
                results[r] = outcome[1]
                if len(outcome) > 2:
                    warnings.warn(f"rank {r} returned a value that cannot be sent back "
                                  f"({outcome[2]}); its entry in the results is None",
                                  RuntimeWarning)
            elif outcome[0] == "failed":
                failures[r] = outcome[1:]
            else:
                failures[r] = ("died", outcome[1], "")
            pending.discard(r)
        if failures and deadline is None:
            deadline = time.monotonic() + GRACE
    if not failures:
        ranks.release()
        return results
    ranks.stop()
    raise rank_error(failures, pending, [r for r in ranks.procs if r not in failures
                                         and r not in pending])


def _stop(procs):
    """End every rank still running: ask first (SIGTERM), then insist (SIGKILL)."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
            p.join()
