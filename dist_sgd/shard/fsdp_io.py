"""What goes in and out of a FullyShardedDataParallel: collectives (counted) and checkpoints.

Counted starts each collective asynchronously (torch's with async_op=True; ours on the one
ordered helper thread of dist_sgd.comm.ordered, which every wrapper shares so that every rank
issues its collectives in one order) and logs (name, bytes) of each: the bytes per step are
counted from what was issued, never computed from the model.

Checkpoints, at any world size. Each rank holds pieces: a checkpoint of those would load only
at the same world size. So here everything goes in and out *full*, in the plain module's and
the plain optimizer's own layout (pieces gathered on the way out, cut again on the way in):

    full = model.state_dict()                          # every rank calls it (collective)
    optim = full_optim_state_dict(model, optimizer)    # ditto: Adam's state, gathered
    if rank == 0: torch.save({"model": full, "optim": optim}, path)
    ...                                                # later, at any world size:
    model = FullyShardedDataParallel(Net()); optimizer = torch.optim.Adam(model.parameters())
    saved = torch.load(path)
    model.load_state_dict(saved["model"])              # each rank keeps its pieces
    load_full_optim_state_dict(model, optimizer, saved["optim"])

The full dicts also load into the plain module (`Net().load_state_dict(full)`) and the plain
optimizer (`torch.optim.Adam(net.parameters()).load_state_dict(optim)`), and back. Parameter
order is the plain module's: wrapping keeps every parameter's name and place. A dict that
does not fit (other keys, other shapes, one rank's pieces saved at another world size) is
refused with ValueError before anything is changed.
"""
import weakref
from collections import OrderedDict

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from dist_sgd.comm import collectives as ours
from dist_sgd.comm.ordered import start_all_reduce
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


def _piece(full, s, rank, world_size):
    """Rank `rank`'s piece of a full tensor shaped like shard s's parameter (padded)."""
    padded = full.new_zeros(s.size * world_size)
    padded[:s.numel] = full.reshape(-1)
    return padded[rank * s.size:(rank + 1) * s.size].clone()


def _whole(fsdp, piece, s):
    """Every rank's `piece` of shard s, gathered, trimmed and shaped like the parameter."""
    pieces = [torch.empty_like(piece) for _ in range(fsdp.world_size)]
    fsdp.comm.start("all_gather", pieces, piece.detach().contiguous(), count=False).wait()
    return torch.cat(pieces)[:s.numel].view(s.shape)


def _hint(tensor, s):
    """Why a tensor does not fit shard s's full shape: maybe one rank's pieces."""
    if tensor.dim() == 1 and s.numel > 0:
        sizes = [k for k in range(1, 4097) if -(-s.numel // k) == tensor.numel()]
        if sizes:
            return (f" (it looks like one rank's piece, as at world size {sizes[0]}"
                    f"{'-' + str(sizes[-1]) if len(sizes) > 1 else ''}: save the full state "
                    "with model.state_dict() / full_optim_state_dict, not the pieces)")
    return ""


def gather_full_params(fsdp):
    """{name: full parameter} under the plain module's names (every rank calls, and gets it)."""
    shard_of = {id(s.param): s for s in fsdp.shards_by_name.values()}
    return {name: _whole(fsdp, p, shard_of[id(p)]) if id(p) in shard_of else p.detach().clone()
            for name, p in fsdp.module.named_parameters()}


def full_state_dict(fsdp, destination=None, prefix=""):
    out = OrderedDict() if destination is None else destination
    for name, t in fsdp.module.state_dict().items():
        s = fsdp.shards_by_name.get(name)
        out[prefix + name] = _whole(fsdp, t, s) if s is not None else t.detach().clone()
    return out


def load_full_state_dict(fsdp, state_dict, strict=True):
    local = fsdp.module.state_dict()
    problems = []
    if strict:
        problems += [f"missing key {k!r}" for k in local if k not in state_dict]
        problems += [f"unexpected key {k!r}" for k in state_dict if k not in local]
    for name, t in state_dict.items():
        if name not in local:
            continue
        s = fsdp.shards_by_name.get(name)
        want = tuple(s.shape) if s is not None else tuple(local[name].shape)
        if tuple(t.shape) != want:
            problems.append(f"{name}: shape {tuple(t.shape)}, the module's is {want}"
                            + (_hint(t, s) if s is not None else ""))
    if problems:  # refused before anything is copied: the model stays as it was
        raise ValueError("FullyShardedDataParallel.load_state_dict: " + "; ".join(problems))
    mine = {name: _piece(t, fsdp.shards_by_name[name], fsdp.rank, fsdp.world_size)
            if name in fsdp.shards_by_name else t
            for name, t in state_dict.items() if name in local}
    return fsdp.module.load_state_dict(mine, strict=strict)


def _params(optimizer):
    return [p for g in optimizer.param_groups for p in g["params"]]


def full_optim_state_dict(model, optimizer):
    """optimizer.state_dict() with every sharded state tensor (Adam's exp_avg, ...) gathered
    to its parameter's full shape: the plain optimizer's layout. Every rank calls it."""
    shard_of = {id(s.param): s for s in model.shards_by_name.values()}
    local = optimizer.state_dict()
    state = {}
    for i, p in enumerate(_params(optimizer)):
        if i not in local["state"]:
            continue
        s = shard_of.get(id(p))
        state[i] = {k: (_whole(model, v, s) if s is not None and v.shape == s.param.shape
                        else v.detach().clone()) if torch.is_tensor(v) else v
                    for k, v in local["state"][i].items()}
    return {"state": state, "param_groups": [dict(g) for g in local["param_groups"]]}


def load_full_optim_state_dict(model, optimizer, state_dict):
    """Load a full (plain optimizer's) state_dict: each rank keeps its pieces of the state."""
    params, groups = _params(optimizer), state_dict["param_groups"]
    mine = optimizer.param_groups
    if len(groups) != len(mine) or any(len(g["params"]) != len(m["params"])
                                       for g, m in zip(groups, mine)):
        raise ValueError("load_full_optim_state_dict: the state_dict's parameter groups do not "
                         "match this optimizer's (number of groups, or parameters per group)")
    shard_of = {id(s.param): s for s in model.shards_by_name.values()}
    # A saved state is keyed by the parameter's position over all groups, in order.
    position = {saved: i for i, saved in enumerate(k for g in groups for k in g["params"])}
    state, problems = {}, []
    for saved, entry in state_dict["state"].items():
        s = shard_of.get(id(params[position[saved]]))
        state[saved] = dict(entry)
        for k, v in entry.items():
            if s is None or not torch.is_tensor(v) or v.dim() == 0:
                continue
            if tuple(v.shape) != tuple(s.shape):
                problems.append(f"parameter {position[saved]} state {k!r}: shape {tuple(v.shape)}, "
                                f"the parameter's full shape is {tuple(s.shape)}" + _hint(v, s))
            else:
                state[saved][k] = _piece(v, s, model.rank, model.world_size)
    if problems:
        raise ValueError("load_full_optim_state_dict: " + "; ".join(problems))
    optimizer.load_state_dict({"state": state, "param_groups": groups})
