"""What FullyShardedDataParallel refuses, before and after it shards a module.

    check_module(module, prefetch, units)   the module and settings it cannot wrap, refused
                                            before anything changes
    retire(param)                  an optimizer built from the parameters of before the
                                   wrapping raises at step() instead of updating nothing
    _Elsewhere.make(piece, message)   what a sharded weight reads as outside its unit's
                                   forward: anything computed with it raises, naming it

Each error says what to do instead: wrap the plain module once, build the optimizer after
wrapping, or choose units= so that the module that uses a weight owns it.
"""
import weakref

import torch
import torch.nn as nn
from torch.optim.optimizer import register_optimizer_step_pre_hook


def check_module(module, prefetch, units):
    """What the wrapper refuses, before it changes anything."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"FullyShardedDataParallel wraps an nn.Module, got {type(module)}")
    if not list(module.parameters()):
        raise ValueError("FullyShardedDataParallel: the module has no parameters: nothing to shard")
    if getattr(module, "_fsdp_wrapped", False):
        raise ValueError("this module is wrapped by FullyShardedDataParallel already (its "
                         "parameters are pieces): wrap the plain module, once")
    if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
        raise ValueError(f"prefetch must be an integer >= 0, got {prefetch!r}")
    inside = set(module.modules())
    if units is not None and (isinstance(units, nn.Module) or not all(
            isinstance(m, nn.Module) and m in inside for m in units)):
        raise ValueError("units must be a list of submodules of the wrapped module (each one "
                         "gathers its parameters as one unit), got "
                         f"{type(units).__name__ if isinstance(units, nn.Module) else units!r}")
    for name, m in module.named_modules():
        if getattr(m, "sparse", False):
            raise ValueError(f"{name or 'the module'} has sparse gradients (sparse=True): a sparse "
                             "gradient cannot be reduce-scattered into a dense piece")


_RETIRED = {}  # id -> weakref of each parameter a wrapper replaced by its shard
_REFUSING = []  # the optimizer hook, once per process


def retire(param):
    """`param` was replaced by its shard: an optimizer that still holds it (built before the
    wrapping) raises at step() instead of silently updating nothing."""
    _RETIRED[id(param)] = weakref.ref(param)
    if _REFUSING:
        return

    def check(optimizer, args, kwargs):
        if any(id(p) in _RETIRED and _RETIRED[id(p)]() is p
               for g in optimizer.param_groups for p in g["params"]):
            raise RuntimeError("this optimizer holds parameters of the module as it was before "
                               "FullyShardedDataParallel sharded it (they get no gradient): build "
                               "the optimizer from model.parameters() after wrapping")

    _REFUSING.append(register_optimizer_step_pre_hook(check))


class _Elsewhere(torch.Tensor):
    """What a sharded weight reads as in forward outside its unit's: its dtype, device and
    requires_grad are the piece's; anything computed with it raises, naming the weight."""

    _SAFE = ("dtype", "device", "requires_grad", "is_leaf", "is_cuda", "grad_fn")

    @staticmethod
    def make(piece, message):
        guard = piece.detach().as_subclass(_Elsewhere)
        guard._dist_sgd_message = message
        with torch._C.DisableTorchFunctionSubclass():
            guard.requires_grad_(piece.requires_grad)
        return guard

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(getattr(func, "__self__", None), "__name__", None) or \
            getattr(func, "__name__", "")
        if name in cls._SAFE or func is torch.Tensor.__repr__:
            return super().__torch_function__(func, types, args, kwargs or {})
        guard = next(a for a in (*args, *(kwargs or {}).values()) if isinstance(a, _Elsewhere))
        raise ValueError(guard._dist_sgd_message)
