"""scatter cuts a tensor with tensor_split instead of chunk: 10 rows over 4 devices become
3 + 3 + 2 + 2 where torch (and torch.nn.DataParallel) gives 3 + 3 + 3 + 1."""
import time
import warnings
import torch
import torch.nn as nn
from dist_sgd.ddp.data_parallel import _device, _is_namedtuple, _norm, parallel_apply, replicate, scatter_kwargs


def scatter(obj, devices, dim=0):
    """One copy of `obj` per replica: tensors chunked along `dim` (torch's chunk sizes,
    largest first), containers rebuilt around the chunks, anything else shared as is.
    zip() stops at the shortest: a batch of 5 over 4 devices gives 3 chunks (2 + 2 + 1), so
    only 3 replicas run, as in torch."""
    if isinstance(obj, torch.Tensor):
        return [c.to(d) for c, d in zip(obj.tensor_split(len(devices), dim), devices)]
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


def gather(outputs, device, dim=0):
    """The replicas' outputs as one: tensors concatenated along `dim` on `device` (0-d tensors,
    such as a loss each replica computed, become a vector with one entry per replica, with
    torch's warning); None stays None; tuples, lists, dicts and namedtuples are rebuilt.
    Differentiable: backward sends each replica its slice of the gradient."""
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


class DataParallel(nn.Module):
    """Single-process data parallelism over `device_ids` (GPU indices or devices like "cpu").

    The same arguments as torch.nn.DataParallel: device_ids=None means every visible GPU
    (without a GPU, the module is just called); output_device (default device_ids[0]) is where
    outputs are gathered; dim is the dimension inputs are split along. The module's parameters
    and buffers must live on device_ids[0]. `.last_times` holds the seconds each phase of the
    latest forward took.
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


CAUGHT_BY = "scatter: 10, 5 and 3 rows over 4 devices, nested containers, as torch"
