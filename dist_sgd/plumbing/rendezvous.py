"""Where ranks meet: a free port, the init_method URL (env, tcp, file) and the process group
itself, with the timeout on init and on every operation."""
import datetime
import os
import random
import socket
import tempfile

import torch
import torch.distributed as dist

INIT_METHODS = ("env", "tcp", "file")


PORTS_BELOW_EPHEMERAL = 8000  # how many ports under the kernel's ephemeral range we pick from


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def free_port():
    """A TCP port nobody listens on right now, for a store that rank 0 binds a moment later.
    Taken below the kernel's ephemeral range where there is one: a port the kernel picks (bind
    to 0) is free only until it hands the same port to some outgoing connection as its own
    (many, while gloo connects its pairs), and the store's bind then fails (EADDRINUSE)."""
    low, pick = _ephemeral_low(), random.SystemRandom()
    for _ in range(64 if low and low > PORTS_BELOW_EPHEMERAL + 1024 else 0):
        port = pick.randrange(low - PORTS_BELOW_EPHEMERAL, low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
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
