"""torch DDP's constructor arguments, for our DistributedDataParallel: each one either accepted
with torch's meaning or refused up front, by name, with the reason (never an error from deep
inside torch later). Kept apart from ddp.py: none of it is the idea of DDP.
"""
import numbers

import torch
import torch.distributed as dist

# torch DDP arguments ours refuses unless left at torch's default: name -> (default, why).
_REFUSED = {
    "process_group": (None, "ours reduces over the default (WORLD) group only"),
    "gradient_as_bucket_view": (False, "ours copies the averages back into .grad"),
    "delay_all_reduce_named_params": (None, "ours all-reduces every trainable parameter"),
    "param_to_hook_all_reduce": (None, "ours all-reduces every trainable parameter"),
    "mixed_precision": (None, "no mixed precision in ours"),
    "device_mesh": (None, "ours reduces over the default (WORLD) group only"),
    "skip_all_reduce_unused_params": (False, "ours always reduces every bucket"),
    "bucket_cap_mb_list": (None, "ours has one bucket_cap_mb"),
    "batched_grad_copy": (False, "not implemented in ours"),
}
# Accepted, though ours needs no switch for them: check_reduction (a no-op in torch too), dim
# (only matters for several devices per process).
_ACCEPTED = {"check_reduction", "dim"}


def check_torch_arguments(module, bucket_cap_mb, torch_arguments):
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"DistributedDataParallel wraps an nn.Module, got {type(module)}")
    if isinstance(bucket_cap_mb, bool) or not (bucket_cap_mb is None
                                               or isinstance(bucket_cap_mb, numbers.Real)):
        raise TypeError(f"bucket_cap_mb must be a number or None, got {bucket_cap_mb!r} "
                        "(torch's second positional argument is device_ids: pass it by name)")
    if bucket_cap_mb is not None and not bucket_cap_mb >= 0:
        raise ValueError(f"bucket_cap_mb must be >= 0 or None, got {bucket_cap_mb!r}")
    sparse = [name for name, m in module.named_modules() if getattr(m, "sparse", False)]
    if sparse:
        raise ValueError(f"{sparse[0]} makes sparse gradients (sparse=True): our "
                         "DistributedDataParallel handles dense gradients only")
    for name, value in torch_arguments.items():
        if name == "process_group" and value is dist.group.WORLD:
            continue  # the default group, named: what ours uses anyway
        if name in _REFUSED and value != _REFUSED[name][0]:
            raise ValueError(f"our DistributedDataParallel does not support {name}="
                             f"{value!r}: {_REFUSED[name][1]}")
        if name not in _REFUSED and name not in _ACCEPTED:
            raise TypeError(f"unexpected argument {name!r} (torch's DDP does not take it "
                            "either, or it is newer than torch 2.14)")


def single_device(module, device_ids, output_device):
    """torch's device_ids for one device per process: must be the module's device."""
    if device_ids is None:
        if output_device is not None:
            raise ValueError("output_device without device_ids: torch's DDP ignores it on CPU; "
                             "ours refuses it so the mistake shows")
        return None
    if len(device_ids) != 1:
        raise ValueError(f"device_ids={device_ids!r}: ours, like torch's, takes exactly one "
                         "device per process (one rank per device)")
    device = torch.device("cuda", device_ids[0]) if isinstance(device_ids[0], int) \
        else torch.device(device_ids[0])
    held = {p.device for p in module.parameters()}
    if held != {device}:
        raise ValueError(f"device_ids={device_ids!r} but the module's parameters are on "
                         f"{sorted(map(str, held))}: move the module first (module.to(device))")
    if output_device is not None and torch.device(output_device if not isinstance(
            output_device, int) else f"cuda:{output_device}") != device:
        raise ValueError(f"output_device={output_device!r} differs from device_ids[0]: "
                         "not supported (outputs stay on the module's device)")
    return device


def to_device(obj, device):
    """Move every tensor in nested tuples/lists/dicts to device (torch's DDP does it)."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return type(obj)(to_device(o, device) for o in obj)
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    return obj
