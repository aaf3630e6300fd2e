"""Where ranks meet: a free port, the init_method URL (env, tcp, file) and the process group
itself, with the timeout on init and on every operation."""
import datetime
import os
import socket
import tempfile

import torch
import torch.distributed as dist

INIT_METHODS = ("env", "tcp", "file")


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
