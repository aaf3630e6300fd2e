"""DataParallel from scratch: one process, the batch split over replicas run in threads.

    model = DataParallel(Net().cuda())                  # every visible GPU
    model = DataParallel(Net(), device_ids=["cpu"] * 2) # two CPU replicas in two threads
    loss = F.nll_loss(model(x), y); loss.backward()     # the gradient of the whole batch

Every forward does four things (torch.nn.DataParallel does the same, in the same order):
1. scatter: split the batch along dimension 0 into one chunk per device (and copy it there);
2. replicate: a shallow copy of the module per device whose parameters are *differentiable
   copies* of the original ones (on the original's device, the originals themselves);
3. parallel_apply: run each replica on its chunk, each in its own thread;
4. gather: concatenate the outputs on the first device.
There is no all-reduce: the copies of step 2 are autograd operations, so the single backward
from the gathered output flows back through them and *sums* every replica's gradient into the
original parameters - the gradient of the whole batch, exactly what one process computes.

Why people moved to DistributedDataParallel: the module is copied again on every forward, the
first device does the gathering and the loss for everyone, and the threads share one Python
interpreter, whose lock (the GIL) lets only one thread run Python code at a time. Torch
releases the GIL inside its kernels, so big layers can run in parallel, but all the Python
between them is serialized; and on the CPU, autograd runs the whole backward in one thread.
torch.nn.DataParallel with no GPU simply calls the module: that is also what ours does when
device_ids is None and there is no GPU.
"""
import threading
from contextlib import nullcontext
import time

import torch
import torch.nn as nn


def scatter(inputs, devices):
    """Split every tensor in `inputs` (a tuple) along dim 0, one chunk per device; anything
    else (and keyword arguments) is passed to every replica as is. Fewer chunks than devices
    when the batch is small (5 items over 4 devices: 2 + 2 + 1, as torch splits it)."""
    tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
    if not tensors:
        raise ValueError("DataParallel needs at least one tensor argument to split the batch")
    n = tensors[0].shape[0] if tensors[0].dim() else 0
    if n == 0:
        raise ValueError("DataParallel cannot split an empty batch (or a 0-d tensor)")
    if any(t.dim() == 0 or t.shape[0] != n for t in tensors):
        raise ValueError(f"every tensor argument must have the batch size {n} in dimension 0, "
                         f"got shapes {[tuple(t.shape) for t in tensors]}")
    # The same split as torch: chunk() sizes, largest first. chunk() may give fewer pieces
    # than asked (a batch of 5 in 4 chunks of ceil(5/4) = 2 is 3 pieces), so count them.
    chunks = len(tensors[0].chunk(min(n, len(devices))))
    split = [x.chunk(chunks) if isinstance(x, torch.Tensor) else [x] * chunks for x in inputs]
    return [tuple(s[i].to(devices[i]) if isinstance(s[i], torch.Tensor) else s[i] for s in split)
            for i in range(chunks)]


def replicate(module, devices):
    """A replica of `module` per device, sharing the code and config, whose parameters are
    autograd copies of the originals: gradients flow from every replica back to them."""
    return [_copy_module(module, torch.device(d), {}) for d in devices]


def _copy_module(module, dev, memo):
    if module in memo:  # a submodule used twice stays one submodule in the replica
        return memo[module]
    replica = module.__new__(type(module))
    replica.__dict__ = module.__dict__.copy()  # same config, hooks, training flag
    memo[module] = replica
    # A tensor in _parameters that is not a leaf: allowed, and autograd tracks the copy.
    # On the original's own device .to() returns the original: shared, as on one CPU.
    replica._parameters = {k: None if p is None else p.to(dev)
                           for k, p in module._parameters.items()}
    replica._buffers = {k: None if b is None else b.to(dev) for k, b in module._buffers.items()}
    replica._modules = {k: None if m is None else _copy_module(m, dev, memo)
                        for k, m in module._modules.items()}
    return replica


def parallel_apply(replicas, inputs, devices, kwargs=None):
    """Run replicas[i](*inputs[i], **kwargs) in one thread each; outputs in order. Grad mode
    and the current GPU are per thread in torch, so each thread sets them; a replica's error
    is re-raised here, in the caller's thread."""
    kwargs = kwargs or {}
    grad_enabled = torch.is_grad_enabled()
    results = [None] * len(replicas)

    def work(i):
        try:
            gpu = torch.cuda.device(devices[i]) if devices[i].type == "cuda" else nullcontext()
            with torch.set_grad_enabled(grad_enabled), gpu:
                results[i] = ("ok", replicas[i](*inputs[i], **kwargs))
        except BaseException as e:  # noqa: BLE001 - carried to the caller's thread
            results[i] = ("error", e)

    if len(replicas) == 1:
        work(0)
    else:
        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(replicas))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for i, (status, value) in enumerate(results):
        if status == "error":
            raise RuntimeError(f"replica {i} failed: {type(value).__name__}: {value}") from value
    return [value for _, value in results]


def gather(outputs, device):
    """Concatenate the replicas' outputs (tensors, or tuples/lists/dicts of them) along dim 0
    on `device`. Differentiable: backward sends each replica its slice of the gradient."""
    first = outputs[0]
    if isinstance(first, torch.Tensor):
        return torch.cat([o.to(device) for o in outputs])
    if isinstance(first, (tuple, list)):
        return type(first)(gather([o[i] for o in outputs], device) for i in range(len(first)))
    if isinstance(first, dict):
        return {k: gather([o[k] for o in outputs], device) for k in first}
    raise TypeError(f"DataParallel cannot gather outputs of type {type(first).__name__}")


class DataParallel(nn.Module):
    """Single-process data parallelism over `device_ids` (GPU indices or devices like "cpu").

    device_ids=None: every visible GPU; without a GPU, the module is just called. The module's
    parameters must live on device_ids[0], where the output is gathered.
    `.last_times` holds the seconds each phase of the latest forward took.
    """

    def __init__(self, module, device_ids=None):
        super().__init__()
        self.module = module
        if device_ids is None:
            device_ids = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
        self.devices = [torch.device("cuda", d) if isinstance(d, int) else torch.device(d)
                        for d in device_ids]
        self.last_times = {}
        if self.devices:
            home = next(module.parameters(), torch.empty(0, device=self.devices[0])).device
            if _norm(home) != _norm(self.devices[0]):
                raise ValueError(f"the module's parameters are on {home}, but device_ids[0] is "
                                 f"{self.devices[0]}: move the module there first")

    def forward(self, *inputs, **kwargs):
        if len(self.devices) <= 1:  # nothing to split over: torch does the same
            return self.module(*inputs, **kwargs)
        t0 = time.perf_counter()
        chunks = scatter(inputs, self.devices)
        t1 = time.perf_counter()
        replicas = replicate(self.module, self.devices[:len(chunks)])
        t2 = time.perf_counter()
        outputs = parallel_apply(replicas, chunks, self.devices, kwargs)
        t3 = time.perf_counter()
        out = gather(outputs, self.devices[0])
        t4 = time.perf_counter()
        self.last_times = {"scatter": t1 - t0, "replicate": t2 - t1, "apply": t3 - t2,
                           "gather": t4 - t3}
        return out


def _norm(dev):
    """cuda and cuda:0 (the current device) are the same place."""
    dev = torch.device(dev)
    if dev.type == "cuda" and dev.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return dev
