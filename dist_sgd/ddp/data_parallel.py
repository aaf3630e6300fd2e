"""DataParallel from scratch: one process, the batch split over replicas run in threads.

    model = DataParallel(Net().cuda())                  # every visible GPU
    model = DataParallel(Net(), device_ids=["cpu"] * 2) # two CPU replicas in two threads
    loss = F.nll_loss(model(x), y); loss.backward()     # the gradient of the whole batch

Every forward does four things (torch.nn.DataParallel does the same, in the same order):
1. scatter: split every tensor of the inputs (positional and keyword, nested in tuples, lists,
   dicts and namedtuples) along `dim` into one chunk per device, and copy it there;
2. replicate: a shallow copy of the module per device whose parameters are *differentiable
   copies* of the original ones (on the original's device, the originals themselves);
3. parallel_apply: run each replica on its chunk, each in its own thread;
4. gather: concatenate the outputs (tensors, nested in the same containers) on output_device.
There is no all-reduce: the copies of step 2 are autograd operations, so the single backward
from the gathered output flows back through them and *sums* every replica's gradient into the
original parameters - the gradient of the whole batch, exactly what one process computes.

Why people moved to DDP, and where ours differs from torch's: DataParallel's docstring.
"""
import threading
import time
import warnings
from contextlib import nullcontext

import torch
import torch.nn as nn

from dist_sgd.plumbing.mine import swap_in


def _is_namedtuple(obj):
    """A namedtuple (rebuilt with type(obj)(*parts), not type(obj)(parts))."""
    return isinstance(obj, tuple) and hasattr(obj, "_asdict") and hasattr(obj, "_fields")


def _tensors_in(obj):
    """Every tensor in a nest of tuples, lists and dicts, in order."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [t for x in obj for t in _tensors_in(x)]
    if isinstance(obj, dict):
        return [t for x in obj.values() for t in _tensors_in(x)]
    return []


def _check_batch(obj, dim):
    """All tensors must split alike: the same size along `dim`, and not empty there."""
    sizes = {tuple(t.shape) for t in _tensors_in(obj)}
    for shape in sizes:
        if len(shape) <= dim:
            raise ValueError(f"DataParallel splits inputs along dim {dim}, but one tensor "
                             f"has shape {shape}")
    if len({shape[dim] for shape in sizes}) > 1:
        raise ValueError(f"every tensor argument (keyword arguments too) must have the same size "
                         f"along dim {dim} to be split alike, got shapes {sorted(sizes)}")
    if sizes and next(iter(sizes))[dim] == 0:
        raise ValueError("DataParallel cannot split an empty batch")


def scatter(obj, devices, dim=0):
    """One copy of `obj` per replica: tensors chunked along `dim` (torch's chunk sizes,
    largest first), containers rebuilt around the chunks, anything else shared as is.
    zip() stops at the shortest: a batch of 5 over 4 devices gives 3 chunks (2 + 2 + 1), so
    only 3 replicas run, as in torch."""
    # ---- exercise DataParallel: one copy of obj per device, every tensor chunked along dim
    if isinstance(obj, torch.Tensor):
        return [c.to(d) for c, d in zip(obj.chunk(len(devices), dim), devices)]
    if _is_namedtuple(obj):
        return [type(obj)(*parts) for parts in zip(*(scatter(x, devices, dim) for x in obj))]
    if isinstance(obj, tuple) and obj:
        return list(zip(*(scatter(x, devices, dim) for x in obj)))
    if isinstance(obj, list) and obj:
        return [list(parts) for parts in zip(*(scatter(x, devices, dim) for x in obj))]
    if isinstance(obj, dict) and obj:
        pieces = (scatter(kv, devices, dim) for kv in obj.items())
        return [type(obj)(items) for items in zip(*pieces)]
    return [obj for _ in devices]
    # ---- end of exercise


def scatter_kwargs(inputs, kwargs, devices, dim=0):
    """Scatter the positional and the keyword arguments alike; pad the shorter list."""
    _check_batch((inputs, kwargs), dim)
    ins = scatter(inputs, devices, dim) if inputs else []
    kws = scatter(kwargs, devices, dim) if kwargs else []
    ins += [()] * (len(kws) - len(ins))
    kws += [{}] * (len(ins) - len(kws))
    return ins, kws


def replicate(module, devices):
    """A replica of `module` per device, sharing the code and config, whose parameters are
    autograd copies of the originals: gradients flow from every replica back to them.
    Buffers (BatchNorm's running statistics) are copies without autograd; replica 0 keeps the
    originals, so its updates are the ones that last - as in torch, where the other replicas'
    copies are thrown away. On one CPU that also means no two threads update one buffer."""
    memo = [{} for _ in devices]
    return [_copy_module(module, torch.device(d), memo[i], first=(i == 0))
            for i, d in enumerate(devices)]


def _copy_module(module, dev, memo, first):
    if module in memo:  # a submodule used twice stays one submodule in the replica
        return memo[module]
    replica = module.__new__(type(module))
    replica.__dict__ = module.__dict__.copy()  # same config, hooks, training flag
    memo[module] = replica
    # A tensor in _parameters that is not a leaf: allowed, and autograd tracks the copy.
    # On the original's own device .to() returns the original: shared, as on one CPU.
    replica._parameters = {k: None if p is None else p.to(dev)
                           for k, p in module._parameters.items()}
    replica._buffers = {k: None if b is None else _copy_buffer(b, dev, first)
                        for k, b in module._buffers.items()}
    replica._modules = {k: None if m is None else _copy_module(m, dev, memo, first)
                        for k, m in module._modules.items()}
    return replica


def _copy_buffer(buffer, dev, first):
    if first:
        return buffer.to(dev)  # on its own device: the original itself
    copy = buffer.detach().to(dev)
    # Same device (CPU replicas): .to() gave the original back, so take a copy of our own.
    return copy.clone() if copy.data_ptr() == buffer.data_ptr() else copy


def parallel_apply(replicas, inputs, devices, kwargs=None):
    """Run replicas[i](*inputs[i], **kwargs[i]) in one thread each; outputs in order. Grad
    mode and the current GPU are per thread in torch, so each thread sets them; a replica's
    error is re-raised here, in the caller's thread."""
    kwargs = kwargs or [{}] * len(replicas)
    grad_enabled = torch.is_grad_enabled()
    results = [None] * len(replicas)

    def work(i):
        try:
            gpu = torch.cuda.device(devices[i]) if devices[i].type == "cuda" else nullcontext()
            with torch.set_grad_enabled(grad_enabled), gpu:
                results[i] = ("ok", replicas[i](*inputs[i], **kwargs[i]))
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


def gather(outputs, device, dim=0):
    """The replicas' outputs as one: tensors concatenated along `dim` on `device` (0-d tensors,
    such as a loss each replica computed, become a vector with one entry per replica, with
    torch's warning); None stays None; tuples, lists, dicts and namedtuples are rebuilt.
    Differentiable: backward sends each replica its slice of the gradient."""
    # ---- exercise DataParallel: the outputs as one, tensors concatenated along dim on device
    first = outputs[0]
    if isinstance(first, torch.Tensor):
        if dim == 0 and all(o.dim() == 0 for o in outputs):
            warnings.warn("Was asked to gather along dimension 0, but all input tensors were "
                          "scalars; will instead unsqueeze and return a vector.", stacklevel=2)
            outputs = [o.view(1) for o in outputs]
        return torch.cat([o.to(device) for o in outputs], dim)
    if first is None:
        return None
    if isinstance(first, dict):
        if not all(len(first) == len(o) for o in outputs):
            raise ValueError("All dicts must have the same number of keys")
        return type(first)((k, gather([o[k] for o in outputs], device, dim)) for k in first)
    if _is_namedtuple(first):
        return type(first)._make(gather(list(xs), device, dim) for xs in zip(*outputs, strict=True))
    if isinstance(first, (tuple, list)):
        return type(first)(gather(list(xs), device, dim) for xs in zip(*outputs, strict=True))
    raise TypeError(f"DataParallel cannot gather outputs of type {type(first).__name__}: return "
                    f"tensors, None, or tuples, lists, dicts or namedtuples of them")
    # ---- end of exercise


class DataParallel(nn.Module):
    """Single-process data parallelism over `device_ids` (GPU indices or devices like "cpu").

    The same arguments as torch.nn.DataParallel: device_ids=None means every visible GPU
    (without a GPU, the module is just called); output_device (default device_ids[0]) is where
    outputs are gathered; dim is the dimension inputs are split along. The module's parameters
    and buffers must live on device_ids[0]. `.last_times` holds the seconds each phase of the
    latest forward took.

    Why people moved to DistributedDataParallel: the module is copied again on every forward, the
    first device does the gathering and the loss for everyone, and the threads share one Python
    interpreter, whose lock (the GIL) lets only one thread run Python code at a time. Torch
    releases the GIL inside its kernels, so big layers can run in parallel, but all the Python
    between them is serialized; and on the CPU, autograd runs the whole backward in one thread.
    torch.nn.DataParallel with no GPU simply calls the module: that is also what ours does when
    device_ids is None and there is no GPU.

    Where ours differs from torch's (README, "How ours differs from torch's"): tensors whose sizes
    along `dim` differ are refused (torch chunks each separately and silently pairs them up wrong
    or drops replicas); an empty batch and 0-d tensor inputs are refused with a clear message.
    """

    def __init__(self, module, device_ids=None, output_device=None, dim=0):
        super().__init__()
        self.module = module
        self.dim = dim
        if device_ids is None:
            device_ids = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
        self.devices = [_device(d) for d in device_ids]
        self.output_device = _device(output_device if output_device is not None
                                     else (self.devices or ["cpu"])[0])
        self.last_times = {}

    def forward(self, *inputs, **kwargs):
        if not self.devices:  # no GPU: torch calls the module, so do we
            return self.module(*inputs, **kwargs)
        home = _norm(self.devices[0])
        for t in list(self.module.parameters()) + list(self.module.buffers()):
            if _norm(t.device) != home:
                raise RuntimeError(f"module must have its parameters and buffers on device "
                                   f"{self.devices[0]} (device_ids[0]) but found one of them on "
                                   f"device: {t.device}")
        # ---- exercise DataParallel: scatter, replicate, run the replicas in threads, gather
        t0 = time.perf_counter()
        ins, kws = scatter_kwargs(inputs, kwargs, self.devices, self.dim)
        if not ins:  # a forward without arguments runs once, on the first device
            ins, kws = [()], [{}]
        if len(self.devices) == 1:
            return self.module(*ins[0], **kws[0])
        t1 = time.perf_counter()
        replicas = replicate(self.module, self.devices[:len(ins)])
        t2 = time.perf_counter()
        outputs = parallel_apply(replicas, ins, self.devices, kws)
        t3 = time.perf_counter()
        out = gather(outputs, self.output_device, self.dim)
        t4 = time.perf_counter()
        self.last_times = {"scatter": t1 - t0, "replicate": t2 - t1, "apply": t3 - t2,
                           "gather": t4 - t3}
        return out
        # ---- end of exercise


def _device(d):
    """A device from what a user passes: an int is a GPU index (as torch's device_ids)."""
    return torch.device("cuda", d) if isinstance(d, int) else torch.device(d)


def _norm(dev):
    """cuda and cuda:0 (the current device) are the same place."""
    dev = torch.device(dev)
    if dev.type == "cuda" and dev.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return dev


# DIST_SGD_MINE: a learner's version replaces this one
swap_in(globals(), "DataParallel", ("scatter", "gather", "DataParallel"), lesson="08")
