"""Run one function on N ranks: spawned here, or one rank per process under torchrun.

    launch(fn, 4, *args)      # spawns 4 local processes, each runs fn(rank, 4, *args)

Under torchrun (RANK / WORLD_SIZE / LOCAL_RANK set in the environment) nothing is spawned:
this process *is* one rank, so the same lesson file runs on a laptop, on 8 GPUs or on
several nodes. Every rank gets a process group (gloo on CPU, NCCL with one GPU per rank),
a timeout on init and on every operation, and a torn-down group at the end.

Nothing waits forever: when a rank raises or dies, the launcher stops the others and raises
RankError naming the rank and carrying its traceback; when a rank hangs, its peers' next
receive times out (after `timeout` seconds) and that failure is reported the same way.
"""
import datetime
import multiprocessing as mp
import multiprocessing.connection
import os
import pickle
import shutil
import socket
import sys
import tempfile
import time
import traceback

import torch
import torch.distributed as dist

# Lessons and tests never need more than this for one operation; real jobs pass their own.
DEFAULT_TIMEOUT = float(os.environ.get("DIST_SGD_TIMEOUT", 120))
INIT_METHODS = ("env", "tcp", "file")


class RankError(RuntimeError):
    """A rank raised, died or timed out. `.rank` says which one."""

    def __init__(self, rank, message):
        super().__init__(message)
        self.rank = rank


def under_torchrun():
    """True when a launcher (torchrun, or a cluster's) already made this process one rank."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def default_backend(world_size=None):
    """NCCL when every local rank can have a GPU of its own, gloo otherwise."""
    n_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size or 1))
    if n_gpus >= local and dist.is_nccl_available():
        return "nccl"
    return "gloo"


def device():
    """The device this rank computes on: its own GPU under NCCL, the CPU under gloo."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")


def _rank():
    """This process's rank: from the group, else from RANK (a rank before or after its group
    exists: under torchrun, or spawned by launch), else 0 (a plain process)."""
    return dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", 0))


def log(*args, **kwargs):
    """print() from rank 0 only (or from a process that is no rank, like the launcher)."""
    if _rank() == 0:
        print(*args, **kwargs, flush=True)


def rank_print(*args, **kwargs):
    """print() from every rank, prefixed with [rank r]: for output that differs per rank."""
    rank = _rank()
    sep, end = kwargs.pop("sep", " "), kwargs.pop("end", "\n")
    # One write per line, newline included: ranks share the terminal, and print() writes the
    # text and the newline separately, so two ranks' lines could run together.
    file = kwargs.pop("file", None) or sys.stdout
    file.write(sep.join([f"[rank {rank}]"] + [str(a) for a in args]) + end)
    file.flush()


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
        return "file://" + os.path.join(workdir or tempfile.mkdtemp(prefix="dist_sgd_"), "rendezvous")
    if "://" in init_method:
        return init_method
    raise ValueError(f"init_method must be one of {INIT_METHODS} or a URL, got {init_method!r}")


def _init(rank, world_size, backend, url, timeout):
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group(backend, init_method=url, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout))


def _teardown(ok):
    if not dist.is_initialized():
        return
    if ok:
        # Rank 0 hosts the rendezvous store: let everyone finish before it goes away.
        dist.barrier()
    dist.destroy_process_group()


def _child(fn, rank, world_size, args, backend, url, timeout, threads, env, conn):
    os.environ.clear()  # the launcher's environment now, not the fork server's from earlier
    os.environ.update(env)
    torch.set_num_threads(threads)  # one process per rank: more threads only fight for cores
    # Results travel as plain pickles (copies): torch's shared-memory tensors would vanish
    # with this process, which exits right after sending.
    ok = False
    try:
        _init(rank, world_size, backend, url, timeout)
        result = fn(rank, world_size, *args)
        ok = True
        _teardown(ok)
        conn.send_bytes(pickle.dumps(("ok", result)))
    except BaseException as e:  # noqa: BLE001 - report everything, KeyboardInterrupt too
        try:
            conn.send_bytes(pickle.dumps(("error", f"{type(e).__name__}: {e}", traceback.format_exc())))
        finally:
            os._exit(1)  # skip the teardown: peers may be gone, and nothing must block here


def _context():
    """How ranks start. "forkserver" (default): one server process imports torch once, and
    each rank is forked from it in milliseconds, instead of a fresh interpreter importing
    torch (~2 s per rank on 2 cores, most of a test's time). The server has run no torch
    code, so it holds no thread pool or CUDA state that a fork could break (forking *this*
    process, which may have, can deadlock). DIST_SGD_START_METHOD=spawn is the plain way."""
    method = os.environ.get("DIST_SGD_START_METHOD", "forkserver")
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(["torch", "torch.distributed", "dist_sgd.launch"])
    return ctx


def launch(fn, world_size=None, *args, backend=None, init_method="env",
           timeout=DEFAULT_TIMEOUT, threads=1):
    """Run fn(rank, world_size, *args) on every rank; return the list of results by rank.

    Spawned locally, the list holds every rank's return value (they must be picklable).
    Under torchrun this process is one rank, so the list holds only this rank's value.
    Raises RankError, naming the rank, when any rank fails; no process is left behind.
    """
    if timeout is None or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if under_torchrun():
        return [_run_here(fn, world_size, args, backend, timeout)]
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    backend = backend or default_backend(world_size)
    workdir = tempfile.mkdtemp(prefix="dist_sgd_")
    url = init_url(init_method, workdir)
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(world_size)}
    ctx = _context()
    procs, conns = [], []
    try:
        for rank in range(world_size):
            recv_end, send_end = ctx.Pipe(duplex=False)
            rank_env = dict(os.environ, **env, RANK=str(rank), LOCAL_RANK=str(rank))
            p = ctx.Process(target=_child, name=f"rank{rank}",
                            args=(fn, rank, world_size, args, backend, url, timeout, threads,
                                  rank_env, send_end))
            p.start()
            send_end.close()
            procs.append(p)
            conns.append(recv_end)
        return _collect(procs, conns)
    finally:
        _stop(procs)
        shutil.rmtree(workdir, ignore_errors=True)  # the file:// rendezvous, if any


# When one rank fails, its peers usually fail a moment later *because* of it ("Connection
# reset by peer" when it died, "timed out" when it hangs). Those are symptoms: the launcher
# waits GRACE seconds for every report, then blames the most likely cause, in this order.
GRACE = 1.0
_SYMPTOMS = (("connection closed", "connection reset", "broken pipe", "connection refused"),
             ("timed out", "timeout"))


def _cause_rank(kind, text):
    """0: the rank's own code raised; 1: it died; 2: a peer vanished; 3: a peer went silent."""
    if kind == "died":
        return 1
    lowered = text.lower()
    for level, words in enumerate(_SYMPTOMS, start=2):
        if any(w in lowered for w in words):
            return level
    return 0


def _collect(procs, conns):
    """Wait for every rank's result; on failure, raise RankError naming the rank to blame."""
    results, pending = [None] * len(procs), set(range(len(procs)))
    failures, deadline = {}, None  # rank -> (kind, message, traceback), in order of arrival
    while pending and (deadline is None or time.monotonic() < deadline):
        waitables = [conns[r] for r in pending] + [procs[r].sentinel for r in pending]
        mp.connection.wait(waitables, timeout=0.2 if deadline else 1.0)
        for r in sorted(pending):
            msg, closed = None, False
            if conns[r].poll():
                try:
                    msg = pickle.loads(conns[r].recv_bytes())
                except EOFError:  # pipe closed without a message: the process died
                    closed = True
            if msg is not None and msg[0] == "ok":
                results[r] = msg[1]
            elif msg is not None:
                failures[r] = ("error", msg[1], msg[2])
            elif closed or not procs[r].is_alive():
                if not closed and conns[r].poll():
                    continue  # it reported just before exiting: read it next round
                procs[r].join(timeout=5)
                code = procs[r].exitcode
                how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
                failures[r] = ("died", f"died without reporting a result ({how})", "")
            else:
                continue
            pending.discard(r)
        if failures and deadline is None:
            deadline = time.monotonic() + GRACE
    if not failures:
        return results
    _stop(procs)
    blamed = min(failures, key=lambda r: (_cause_rank(*failures[r][:2]), list(failures).index(r)))
    kind, text, tb = failures[blamed]
    lines = [f"rank {blamed} failed: {text}" if kind == "error" else f"rank {blamed} {text}"]
    for r, (_, other, _) in failures.items():
        if r != blamed:
            lines.append(f"rank {r} also failed, probably as a consequence: {other.splitlines()[0][:300]}")
    if pending:
        lines.append("still running then (now stopped): " + ", ".join(f"rank {r}" for r in sorted(pending)))
        if _cause_rank(kind, text) == 3:
            lines.append("a timeout means a peer stopped answering: look at the rank(s) still "
                         "running, which probably hung (or pass a longer timeout for slow work)")
    if tb:
        lines.append(f"--- traceback from rank {blamed} ---\n{tb}")
    raise RankError(blamed, "\n".join(lines))


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


def _run_here(fn, world_size, args, backend, timeout):
    """torchrun made this process a rank already: join the group it describes and run fn."""
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world_size not in (None, size) and rank == 0:
        print(f"note: running under torchrun with WORLD_SIZE={size}; "
              f"ignoring the requested world size {world_size}", flush=True)
    backend = backend or default_backend(size)
    _init(rank, size, backend, "env://", timeout)
    ok = False
    try:
        result = fn(rank, size, *args)
        ok = True
        return result
    finally:
        _teardown(ok)


def lesson_parser(doc, world_size=2):
    """The flags every lesson shares: --world-size, --backend, --quick."""
    import argparse

    parser = argparse.ArgumentParser(description=doc.strip().splitlines()[0] if doc else None,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world-size", type=int, default=world_size,
                        help=f"number of ranks to spawn (default {world_size}; "
                             "ignored under torchrun, which sets WORLD_SIZE)")
    parser.add_argument("--backend", choices=("gloo", "nccl", "mpi"), default=None,
                        help="default: nccl with one GPU per rank, else gloo")
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes: the smoke test and the lesson tour use this")
    return parser
