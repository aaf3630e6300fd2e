"""Runs the replicas one after the other in the calling thread: the output and gradients are
right, but nothing runs at once, so on p devices a step takes as long as on one. The idea
of DataParallel is one thread per replica, all running together (parallel_apply)."""
import time
import warnings
import torch
import torch.nn as nn
from dist_sgd.ddp.data_parallel import (_device, _is_namedtuple, _norm, parallel_apply, replicate,
                                        scatter_kwargs)


CAUGHT_BY = "the replicas run at once, each in a thread: 3 forwards meet at a barrier"
HINT = "run the replicas at the same time, one thread each"


def scatter(obj, devices, dim=0):
    """One copy of `obj` per replica: tensors chunked along `dim` (torch's chunk sizes,
    largest first), containers rebuilt around the chunks, anything else shared as is.
    zip() stops at the shortest: a batch of 5 over 4 devices gives 3 chunks (2 + 2 + 1), so
    only 3 replicas run, as in torch."""
    if isinstance(obj, torch.Tensor):
        return [c.to(d) for c, d in zip(obj.chunk(len(devices), dim), devices)]
    if _is_namedtuple(obj):
        return [type(obj)(*parts) for parts in zip(*(scatter(o, devices, dim) for o in obj))]
    if isinstance(obj, (tuple, list)) and len(obj) > 0:
        return [type(obj)(parts) for parts in zip(*(scatter(o, devices, dim) for o in obj))]
    if isinstance(obj, dict) and len(obj) > 0:
        keys = list(obj)
        return [type(obj)(zip(keys, parts))
                for parts in zip(*(scatter(obj[k], devices, dim) for k in keys))]
    return [obj for _ in devices]


def gather(outputs, device, dim=0):
    """The replicas' outputs as one: tensors concatenated along `dim` on `device` (0-d tensors,
    such as a loss each replica computed, become a vector with one entry per replica, with
    torch's warning); None stays None; tuples, lists, dicts and namedtuples are rebuilt.
    Differentiable: backward sends each replica its slice of the gradient."""
    first = outputs[0]
    if isinstance(first, torch.Tensor):
        if first.dim() == 0:
            warnings.warn("gathering scalars: returning a vector instead")
            return torch.cat([o.view(1).to(device) for o in outputs])
        return torch.cat([o.to(device) for o in outputs], dim)
    if first is None:
        return None
    if isinstance(first, dict):
        return type(first)((k, gather([o[k] for o in outputs], device, dim)) for k in first)
    if _is_namedtuple(first):
        return type(first)(*(gather(list(parts), device, dim) for parts in zip(*outputs)))
    if isinstance(first, (tuple, list)):
        return type(first)(gather(list(parts), device, dim) for parts in zip(*outputs))
    return first


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
        ins, kws = scatter_kwargs(inputs, kwargs, self.devices, self.dim)
        replicas = replicate(self.module, self.devices[:len(ins)])
        outs = [r(*i, **k) for r, i, k in zip(replicas, ins, kws)]
        return gather(outs, self.output_device, self.dim)
