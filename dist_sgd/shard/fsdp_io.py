"""What goes in and out of a FullyShardedDataParallel: collectives (counted), full parameters.

Counted starts each collective asynchronously (torch's with async_op=True; ours on the one
ordered helper thread of dist_sgd.ddp.hooks, which every wrapper shares so that every rank
issues its collectives in one order) and logs (name, bytes) of each: the bytes per step are
counted from what was issued, never computed from the model.

Checkpoints (state_dict in and out, full at any world size) are dist_sgd/faults/fsdp_checkpoint.py.
"""
import weakref

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from dist_sgd.comm import collectives as ours
from dist_sgd.ddp.hooks import start_all_reduce
from dist_sgd.shard.zero import wire_bytes

COLLECTIVES = {"torch": dist, "ours": ours}  # the same in-place signatures
_WHOLE = {"all_gather": 0, "reduce_scatter": 1, "all_reduce": 0}  # the argument with all data
_RETIRED = {}  # id -> weakref of each parameter a wrapper replaced by its shard
_REFUSING = []  # the optimizer hook, once per process


class Counted:
    """Start collectives asynchronously, in the order asked, and log (name, bytes) of each."""

    def __init__(self, collectives="torch"):
        if collectives not in COLLECTIVES:
            raise ValueError(f"collectives must be one of {tuple(COLLECTIVES)}, "
                             f"got {collectives!r}")
        self.lib, self.log = COLLECTIVES[collectives], []

    def start(self, name, *args, count=True):
        """A handle with .wait(): torch's Work, or a Future from the ordered helper thread."""
        whole = args[_WHOLE[name]]
        if count:
            self.log.append((name, sum(t.numel() * t.element_size() for t in
                                       (whole if isinstance(whole, list) else [whole]))))
        fn = getattr(self.lib, name)
        if self.lib is dist:
            return fn(*args, async_op=True)
        # start_all_reduce runs any blocking function on the shared helper thread.
        return start_all_reduce(args[0], lambda _: fn(*args))

    def bytes_sent(self, world_size):
        """Bytes this rank sent for the logged collectives (each bandwidth-optimal)."""
        return sum(wire_bytes(name, n, world_size) for name, n in self.log)


def itemsize(dtype):
    return torch.empty(0, dtype=dtype).element_size()


def tensors(x):
    """The tensors in a module's output (a tensor, or lists, tuples, dicts of them)."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in tensors(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in tensors(v)]
    return []


def cast(x, dtype):
    """x with every floating-point tensor in it cast to dtype (compute_dtype's inputs)."""
    if isinstance(x, torch.Tensor):
        return x.to(dtype) if x.is_floating_point() else x
    if isinstance(x, (list, tuple)):
        return type(x)(cast(v, dtype) for v in x)
    if isinstance(x, dict):
        return {k: cast(v, dtype) for k, v in x.items()}
    return x


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


def check_module(module, prefetch):
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
    for name, m in module.named_modules():
        if getattr(m, "sparse", False):
            raise ValueError(f"{name or 'the module'} has sparse gradients (sparse=True): a sparse "
                             "gradient cannot be reduce-scattered into a dense piece")


def _whole(fsdp, piece, s):
    """Every rank's `piece` of shard s, gathered, trimmed and shaped like the parameter."""
    pieces = [torch.empty_like(piece) for _ in range(fsdp.world_size)]
    fsdp.comm.start("all_gather", pieces, piece.detach().contiguous(), count=False).wait()
    return torch.cat(pieces)[:s.numel].view(s.shape)


def gather_full_params(fsdp):
    """{name: full parameter} under the plain module's names (every rank calls, and gets it)."""
    shard_of = {id(s.param): s for s in fsdp.shards_by_name.values()}
    return {name: _whole(fsdp, p, shard_of[id(p)]) if id(p) in shard_of else p.detach().clone()
            for name, p in fsdp.module.named_parameters()}
