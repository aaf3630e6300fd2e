"""Run one function on N ranks: spawned here, or one rank per process under torchrun.

    results = launch(fn, 4, *args)   # fn(rank, 4, *args) on 4 ranks; results[r] is rank r's value
    if results is not None:          # the process that reports: this one, or torchrun's rank 0
        print(results)

Under torchrun (or a cluster launcher that sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)
nothing is spawned: this process *is* one rank, so the same lesson file runs on a laptop, on 8
GPUs or on several nodes. Either way the list of every rank's result comes back in one
process (the spawning parent, or global rank 0) and None in every other torchrun process.
Every rank gets a process group (gloo on CPU, NCCL with one GPU per rank), a timeout on
init and on every operation, and a torn-down group at the end.

Nothing waits forever: when a rank raises or dies, the launcher stops the others and raises
RankError naming the rank that caused it, with every failed rank's traceback; when a rank
hangs, its peers' next receive times out (after `timeout` seconds) and that is reported the
same way. What happens after fn returns never fails because a peer is still busy: a rank
that finished waits (without a time limit: only the launcher watching the ranks ends it)
until every rank has finished, then lets the work it still has in flight finish (see
before_leaving), and only then leaves the group. A spawned rank then ends as the fork server
ends its children, without the interpreter's teardown, whatever the start method: a thread of
torch's that still runs Python then (a future's callback, a Python thread inside torch) would
abort the process ("terminate called without an active exception").
"""
import atexit
import datetime
import multiprocessing as mp
import multiprocessing.connection
import os
import pickle
import shutil
import socket
import sys
import tempfile
import threading
import time
import traceback
import warnings

import torch
import torch.distributed as dist

from dist_sgd.plumbing import watch
from dist_sgd.plumbing.rank import SPAWNED, default_backend, rank as _rank, under_torchrun

# Lessons and tests never need more than this for one operation; real jobs pass their own.
DEFAULT_TIMEOUT = float(os.environ.get("DIST_SGD_TIMEOUT", 120))
INIT_METHODS = ("env", "tcp", "file")
START_METHODS = ("forkserver", "spawn")  # "fork" would copy this process's torch state
# torchrun's per-process variables: describe *its* job, so they are not passed on to ours.
_LAUNCHER_VARS = ("GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE")
_WAIT_FOR_PEERS = datetime.timedelta(days=30)  # "as long as they work": the launcher watches
_TORCH_DISTRIBUTED = os.path.dirname(dist.__file__) + os.sep
_OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # dist_sgd/


class RankError(RuntimeError):
    """A rank raised, died or timed out. `.rank` is the rank blamed (the likely cause);
    `.tracebacks` maps every failed rank to its traceback ("" for a rank that died)."""

    def __init__(self, rank, message, tracebacks=None):
        super().__init__(message)
        self.rank = rank
        self.tracebacks = dict(tracebacks or {})


def free_port():
    """A TCP port nobody listens on right now (the kernel picks it: no fixed ports)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_url(init_method, workdir=None):
    """Turn "env" / "tcp" / "file" into the init_method URL torch.distributed expects."""
    if init_method == "env":
        return "env://"  # MASTER_ADDR / MASTER_PORT / RANK / WORLD_SIZE from the environment
    if init_method == "tcp":
        return f"tcp://127.0.0.1:{free_port()}"
    if init_method == "file":
        # The file must not exist yet; every rank must see the same path (a shared filesystem).
        folder = workdir or tempfile.mkdtemp(prefix="dist_sgd_")
        return "file://" + os.path.join(folder, "rendezvous")
    if "://" in init_method:
        return init_method
    raise ValueError(f"init_method must be one of {INIT_METHODS} or a URL, got {init_method!r}")


def _init(rank, world_size, backend, timeout, url=None, store=None):
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group(backend, init_method=url, store=store, rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(seconds=timeout))


_BEFORE_LEAVING = []  # what every rank calls once every rank's fn has returned, before leaving


def before_leaving(settle):
    """Have every rank call settle(timeout) after every rank's fn has returned and before it
    leaves the group: a part that can still have work in flight then (a helper thread, Python
    callbacks on torch's threads) lets it finish there, waiting up to `timeout` seconds (the
    group's), so none of it runs while the group is destroyed or the process ends. Registered
    once per function; returns it (usable as a decorator)."""
    if settle not in _BEFORE_LEAVING:
        _BEFORE_LEAVING.append(settle)
    return settle


def _settle(timeout):
    """Every before_leaving function; a failure is reported, never raised (fn's work is done)."""
    for settle in list(_BEFORE_LEAVING):
        try:
            settle(timeout)
        except Exception as e:  # noqa: BLE001
            print(f"[rank {_rank()}] warning: work still in flight when the rank left: {e}",
                  file=sys.stderr, flush=True)


def _end_without_teardown():
    """End this process at once, as the fork server ends every child it forks: no interpreter
    teardown. There, a thread of torch's that wants the GIL (a future's callback on a gloo
    thread, a Python thread inside torch) makes the C++ runtime abort the process."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream has nothing to flush
            pass
    os._exit(0)


def _leave_group():
    """Destroy the group if fn left it up; a failure here is reported, never raised: fn's
    work is done and its result delivered."""
    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001
        print(f"[rank {_rank()}] warning: leaving the process group failed: {e}", file=sys.stderr)


def _run_fn(fn, rank, world_size, args):
    """fn's result; sys.exit(0) / sys.exit() inside fn ends the rank normally (as under
    torch's launchers), with result None."""
    try:
        return fn(rank, world_size, *args)
    except SystemExit as e:
        if e.code not in (None, 0):
            raise
        return None


def _from_torch_distributed(exc):
    """Did this exception come out of torch.distributed (a peer vanished or went silent), rather
    than from the rank's own code? Decided by where it was raised, never by its message:
    inside torch.distributed's Python code, or by a native call (work.wait(), a store) made
    from it or from dist_sgd's communication code; DistError is torch's own transport error."""
    if isinstance(exc, dist.DistError):
        return True
    frames = traceback.extract_tb(exc.__traceback__)
    if not isinstance(exc, RuntimeError) or not frames:
        return False  # ValueError, TypeError, ...: a call misused, the rank's own mistake
    where = frames[-1]
    if where.filename.startswith(_TORCH_DISTRIBUTED):
        return True
    native = not (where.line or "").lstrip().startswith("raise")
    return native and where.filename.startswith(_OURS)


def _child(fn, rank, world_size, args, backend, url, timeout, threads, env, conn):
    os.environ.clear()  # the launcher's environment now, not the fork server's from earlier
    os.environ.update(env)
    torch.set_num_threads(threads)  # one process per rank: more threads only fight for cores
    try:
        _init(rank, world_size, backend, timeout, url=url)
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
    for attempt in range(max_restarts + 1):
        try:
            return _spawn(fn, world_size, args, backend, init_method, timeout, threads, attempt,
                          deadline, stall)
        except RankError as e:
            if attempt == max_restarts:
                raise
            print(f"launch: {str(e).splitlines()[0]}; restarting all {world_size} ranks "
                  f"(restart {attempt + 1} of {max_restarts})", file=sys.stderr, flush=True)


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
        self.ctx, self.procs, self.conns = _context(), {}, {}

    def start(self, rank, target, *args):
        """Start target(*args, conn) as `rank`'s process; conn is its end of the pipe, where it
        sends ("ok", result) or ("failed", kind, text, traceback)."""
        here, there = self.ctx.Pipe(duplex=True)
        p = self.ctx.Process(target=target, name=f"rank{rank}", args=(*args, there))
        p.start()
        there.close()
        self.procs[rank], self.conns[rank] = p, here

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
            if msg is not None:
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


# When one rank fails, its peers usually fail a moment later *because* of it: their
# torch.distributed calls report a connection reset (it died) or a timeout (it hangs). Those
# are symptoms. The launcher waits GRACE seconds for every report, then blames, in order:
# a rank whose own code raised, a rank that died, a rank that only reports a symptom.
GRACE = 1.0
_LEVEL = {"error": 0, "died": 1, "symptom": 2}


def _blame(failures):
    """The rank most likely to have caused the others' failures (arrival order breaks ties).
    failures: {rank: (kind, message, traceback)}, in order of arrival."""
    order = list(failures)
    return min(order, key=lambda r: (_LEVEL[failures[r][0]], order.index(r)))


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
        if stall is not None and not failures and \
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


STALLED = "timed out: every rank still running slept"


def stalled_message(ranks, seconds):
    """The RankError's text for a deadlock the launcher saw (see watch.Stall)."""
    names = ", ".join(f"rank {r}" for r in ranks)
    return (f"rank {ranks[0]} failed: {STALLED} for {seconds:g} s ({names}): each waited for a "
            "message no peer sends (a deadlock); the ranks were stopped")


def _returned_early(finished, waiting):
    """Why a collective timed out when no rank failed: a peer left fn without calling it."""
    return [f"rank {r} had already returned from the function while rank {waiting} waited in a "
            f"collective (a collective every rank must call, that rank {r} never called?)"
            for r in finished]


def rank_error(failures, pending=(), finished=()):
    """The RankError for failures ({rank: (kind, message, traceback)}, in order of arrival;
    kind "error" (the rank's own code), "died" or "symptom"): the blamed rank first, the others
    as consequences, the ranks still running (pending) and those done (finished)."""
    blamed = _blame(failures)
    kind, text, tb = failures[blamed]
    lines = [f"rank {blamed} failed: {text}" if kind != "died" else f"rank {blamed} {text}"]
    if kind == "symptom":
        lines += _returned_early(finished, blamed)
    for r, (_, other, _) in failures.items():
        if r != blamed:
            lines.append(f"rank {r} also failed, probably as a consequence: "
                         f"{other.splitlines()[0][:300]}")
    if pending:
        lines.append("still running then (now stopped): "
                     + ", ".join(f"rank {r}" for r in sorted(pending)))
        if kind == "symptom":
            lines.append(f"rank {blamed}'s error came from inside torch.distributed: a peer "
                         "stopped answering. Look at the rank(s) still running, which probably "
                         "hung (or pass a longer timeout for slow work)")
    if tb:
        lines.append(f"--- traceback from rank {blamed} ---\n{tb}")
    return RankError(blamed, "\n".join(lines), {r: f[2] for r, f in failures.items()})


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


def lesson_parser(doc, world_size=2, save_figures=False):
    """The flags every lesson shares: --world-size, --backend, --quick (and --save-figures).

    world_size: the default. A lesson that compares world sizes passes a list (say [1, 2, 4]):
    then --world-size takes one or more (`--world-size 1 2 4`) and args.world_size is a list.
    save_figures: add --save-figures, the only way a lesson writes into the repository.
    """
    import argparse

    parser = argparse.ArgumentParser(description=doc.strip().splitlines()[0] if doc else None,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    several = isinstance(world_size, (list, tuple))
    shown = " ".join(map(str, world_size)) if several else world_size
    default = list(world_size) if several else world_size
    parser.add_argument("--world-size", type=int, default=default,
                        nargs="+" if several else None, metavar="N",
                        help=f"number of ranks to spawn (default {shown}; "
                             "ignored under torchrun, which sets WORLD_SIZE)")
    parser.add_argument("--backend", choices=("gloo", "nccl", "mpi"), default=None,
                        help="default: nccl with one GPU per rank, else gloo")
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes: the smoke test and the lesson tour use this")
    if save_figures:
        parser.add_argument("--save-figures", action="store_true",
                            help="write this lesson's figures and CSVs into figures/")
    return parser
