"""Hogwild! (Recht et al. 2011): several processes update one model in shared memory, no locks.

    model.share_memory()                  # its weights move to shared memory (/dev/shm)
    result = hogwild(model, train_set, processes=2, steps=100, batch_size=32, lr=0.05)
    # `model` itself has been trained: every process wrote into the same weights

Each process draws its own random batches, computes a gradient on whatever the weights are
at that moment (another process may be half-way through writing them) and adds -lr * grad
into the shared weights in place. Nothing is averaged and nothing waits: for sparse updates
collisions are rare and the paper shows SGD still converges; for a dense convnet every step
touches every weight, so updates overwrite each other a little and the loss is noisier.
One machine only: shared memory is the communication, so no bytes cross a network.

Processes start through a fork server (like launch()), results come back through pipes, and
a process that dies or hangs past `timeout` is named and the others are stopped.
"""
import multiprocessing as mp
import multiprocessing.connection
import os
import pickle
import time
import traceback

import torch
import torch.nn.functional as F

TIMEOUT = 300.0


def _train(model, images, labels, rank, steps, batch_size, lr, momentum, seed, conn):
    torch.set_num_threads(1)
    try:
        torch.manual_seed(seed + rank)  # dropout masks differ per process
        g = torch.Generator().manual_seed(seed * 1000 + rank)  # each process its own batches
        # A momentum buffer is private to this process: only the weights are shared.
        optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
        model.train()
        losses, times, start = [], [], time.perf_counter()
        for _ in range(steps):
            # on the CPU: Hogwild's processes share CPU memory
            pick = torch.randint(0, len(images), (batch_size,), generator=g)
            optimizer.zero_grad()  # this process's own gradients: not shared
            loss = F.nll_loss(model(images[pick]), labels[pick])
            loss.backward()
            optimizer.step()  # in place into the shared weights, no lock
            losses.append(loss.item())
            times.append(time.perf_counter() - start)
        conn.send_bytes(pickle.dumps(("ok", {"losses": losses, "times": times})))
    except BaseException as e:  # noqa: BLE001 - report everything, then leave
        text = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
        conn.send_bytes(pickle.dumps(("error", text)))
        os._exit(1)


def hogwild(model, dataset, processes, steps, batch_size, lr, momentum=0.0, seed=0,
            timeout=TIMEOUT):
    """Train `model` (in place, in shared memory) with `processes` lock-free processes.

    dataset: a TensorDataset (images, labels). Returns {"losses": [[per step] per process],
    "times": [[seconds since that process started] per process], "seconds": wall time}.
    """
    for name, v in (("processes", processes), ("steps", steps), ("batch_size", batch_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    for p in model.parameters():
        p.grad = None  # gradients must stay private: share only the weights
    model.share_memory()
    images, labels = dataset.tensors
    ctx = mp.get_context("forkserver")  # not fork: this process has run torch code already
    ctx.set_forkserver_preload(["torch"])
    procs, conns, start = [], [], time.perf_counter()
    try:
        for rank in range(processes):
            recv_end, send_end = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_train, name=f"hogwild{rank}",
                            args=(model, images, labels, rank, steps, batch_size, lr, momentum,
                                  seed, send_end))
            p.start()
            send_end.close()
            procs.append(p)
            conns.append(recv_end)
        results = _collect(procs, conns, timeout)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
            p.join(timeout=5)
    return {"losses": [r["losses"] for r in results], "times": [r["times"] for r in results],
            "seconds": time.perf_counter() - start}


def _collect(procs, conns, timeout):
    results, deadline = [None] * len(procs), time.monotonic() + timeout
    pending = set(range(len(procs)))
    while pending:
        if time.monotonic() > deadline:
            raise TimeoutError(f"hogwild: process(es) {sorted(pending)} still running after "
                               f"{timeout:g} s")
        mp.connection.wait([conns[r] for r in pending] + [procs[r].sentinel for r in pending],
                           timeout=1.0)
        for r in sorted(pending):
            if conns[r].poll():
                try:
                    kind, value = pickle.loads(conns[r].recv_bytes())
                except EOFError:
                    kind, value = "error", "died without reporting"
                if kind != "ok":
                    raise RuntimeError(f"hogwild process {r} failed: {value}")
                results[r] = value
                pending.discard(r)
            elif not procs[r].is_alive():
                raise RuntimeError(f"hogwild process {r} died (exit code {procs[r].exitcode})")
    return results
