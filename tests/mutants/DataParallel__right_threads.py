"""An independent DataParallel: scatter and gather written as one recursive rule each, the
replicas sharing the module's parameters (CPU replicas: the copy of a parameter to its own
device is the parameter itself), one thread per chunk."""
import threading

import torch
import torch.nn as nn


def scatter(obj, devices, dim=0):
    if isinstance(obj, torch.Tensor):
        return [chunk.to(device) for chunk, device in zip(obj.chunk(len(devices), dim), devices)]
    if isinstance(obj, (tuple, list, dict)) and len(obj) > 0:
        items = list(obj.items()) if isinstance(obj, dict) else list(obj)
        per_device = list(zip(*[scatter(item, devices, dim) for item in items]))
        if isinstance(obj, dict):
            return [type(obj)(pieces) for pieces in per_device]
        if hasattr(obj, "_fields"):
            return [type(obj)(*pieces) for pieces in per_device]
        return [type(obj)(pieces) for pieces in per_device]
    return [obj] * len(devices)


def gather(outputs, device, dim=0):
    first = outputs[0]
    if first is None:
        return None
    if isinstance(first, torch.Tensor):
        if dim == 0 and first.dim() == 0:
            return torch.stack([o.to(device) for o in outputs])
        return torch.cat([o.to(device) for o in outputs], dim)
    if isinstance(first, dict):
        return type(first)({k: gather([o[k] for o in outputs], device, dim) for k in first})
    parts = [gather(list(column), device, dim) for column in zip(*outputs)]
    return type(first)(*parts) if hasattr(first, "_fields") else type(first)(parts)


class DataParallel(nn.Module):
    def __init__(self, module, device_ids=None, output_device=None, dim=0):
        super().__init__()
        self.module, self.dim = module, dim
        self.devices = [torch.device(d) for d in (device_ids or ["cpu"])]
        self.output_device = torch.device(output_device or self.devices[0])

    def forward(self, *inputs, **kwargs):
        ins = scatter(inputs, self.devices, self.dim)
        kws = scatter(kwargs, self.devices, self.dim) if kwargs else [{}] * len(ins)
        outputs = [None] * len(ins)
        grad = torch.is_grad_enabled()

        def run(i):
            with torch.set_grad_enabled(grad):
                outputs[i] = self.module(*ins[i], **kws[i])

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(ins))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return gather(outputs, self.output_device, self.dim)
