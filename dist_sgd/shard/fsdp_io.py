"""What comes out of a FullyShardedDataParallel whole, and goes back in: its full parameters,
gathered, and its state_dicts, full, at any world size.

Each rank holds pieces: a checkpoint of those would load only at the same world size. So here
everything goes in and out *full*, in the plain module's and the plain optimizer's own layout
(pieces gathered on the way out, cut again on the way in):

    full = model.state_dict()                          # every rank calls it (collective)
    optim = full_optim_state_dict(model, optimizer)    # ditto: Adam's state, gathered
    if rank == 0: torch.save({"model": full, "optim": optim}, path)
    ...                                                # later, at any world size:
    model = FullyShardedDataParallel(Net()); optimizer = torch.optim.Adam(model.parameters())
    saved = torch.load(path)
    model.load_state_dict(saved["model"])              # each rank keeps its pieces
    load_full_optim_state_dict(model, optimizer, saved["optim"])

What the full dicts load into, and what is refused: load_full_optim_state_dict's docstring.
"""
from collections import OrderedDict

import torch


def whole(fsdp, piece, s):
    """Every rank's `piece` of shard s, gathered, trimmed and shaped like the parameter."""
    pieces = [torch.empty_like(piece) for _ in range(fsdp.world_size)]
    fsdp.comm.start("all_gather", pieces, piece.detach().contiguous(), count=False).wait()
    return torch.cat(pieces)[:s.numel].view(s.shape)


def gather_full_params(fsdp):
    """{name: full parameter} under the plain module's names (every rank calls, and gets it)."""
    shard_of = {id(s.param): s for s in fsdp.shards_by_name.values()}
    return {name: whole(fsdp, p, shard_of[id(p)]) if id(p) in shard_of else p.detach().clone()
            for name, p in fsdp.module.named_parameters()}


def _piece(full, s, rank, world_size):
    """Rank `rank`'s piece of a full tensor shaped like shard s's parameter (padded)."""
    padded = full.new_zeros(s.size * world_size)
    padded[:s.numel] = full.reshape(-1)
    return padded[rank * s.size:(rank + 1) * s.size].clone()


def _hint(tensor, s):
    """Why a tensor does not fit shard s's full shape: maybe one rank's pieces."""
    if tensor.dim() == 1 and s.numel > 0:
        sizes = [k for k in range(1, 4097) if -(-s.numel // k) == tensor.numel()]
        if sizes:
            return (f" (it looks like one rank's piece, as at world size {sizes[0]}"
                    f"{'-' + str(sizes[-1]) if len(sizes) > 1 else ''}: save the full state "
                    "with model.state_dict() / full_optim_state_dict, not the pieces)")
    return ""


def full_state_dict(fsdp, destination=None, prefix=""):
    out = OrderedDict() if destination is None else destination
    for name, t in fsdp.module.state_dict().items():
        s = fsdp.shards_by_name.get(name)
        out[prefix + name] = whole(fsdp, t, s) if s is not None else t.detach().clone()
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
        state[i] = {k: (whole(model, v, s) if s is not None and v.shape == s.param.shape
                        else v.detach().clone()) if torch.is_tensor(v) else v
                    for k, v in local["state"][i].items()}
    return {"state": state, "param_groups": [dict(g) for g in local["param_groups"]]}


def optim_state_problems(fsdp, optimizer, state_dict):
    """What in a full (plain optimizer's) state_dict does not fit this optimizer of fsdp's
    pieces: [] when it fits. Every sharded state tensor must have its parameter's full shape.
    Nothing is gathered (no collective): each rank finds the same on the same dict."""
    groups, mine = state_dict["param_groups"], optimizer.param_groups
    if len(groups) != len(mine) or any(len(g["params"]) != len(m["params"])
                                       for g, m in zip(groups, mine)):
        return ["the state_dict's parameter groups do not match this optimizer's (number of "
                "groups, or parameters per group)"]
    params, shard_of = _params(optimizer), {id(s.param): s for s in fsdp.shards_by_name.values()}
    # A saved state is keyed by the parameter's position over all groups, in order.
    position = {saved: i for i, saved in enumerate(k for g in groups for k in g["params"])}
    problems = []
    for saved, entry in state_dict["state"].items():
        if saved not in position:
            problems.append(f"state for parameter {saved!r}, which no parameter group holds")
            continue
        s = shard_of.get(id(params[position[saved]]))
        for k, v in entry.items():
            if (s is not None and torch.is_tensor(v) and v.dim() > 0
                    and tuple(v.shape) != tuple(s.shape)):
                problems.append(f"parameter {position[saved]} state {k!r}: shape {tuple(v.shape)}, "
                                f"the parameter's full shape is {tuple(s.shape)}" + _hint(v, s))
    return problems


def load_full_optim_state_dict(model, optimizer, state_dict):
    """Load a full (plain optimizer's) state_dict: each rank keeps its pieces of the state.

    The full dicts also load into the plain module (`Net().load_state_dict(full)`) and the plain
    optimizer (`torch.optim.Adam(net.parameters()).load_state_dict(optim)`), and back. Parameter
    order is the plain module's: wrapping keeps every parameter's name and place. A dict that
    does not fit (other keys, other shapes, one rank's pieces saved at another world size) is
    refused with ValueError before anything is changed. dist_sgd.faults.checkpoint's
    save_checkpoint / load_checkpoint use these for a FullyShardedDataParallel.
    """
    problems = optim_state_problems(model, optimizer, state_dict)
    if problems:  # refused before anything is loaded
        raise ValueError("load_full_optim_state_dict: " + "; ".join(problems))
    params, groups = _params(optimizer), state_dict["param_groups"]
    shard_of = {id(s.param): s for s in model.shards_by_name.values()}
    position = {saved: i for i, saved in enumerate(k for g in groups for k in g["params"])}
    state = {}
    for saved, entry in state_dict["state"].items():
        s = shard_of.get(id(params[position[saved]]))
        state[saved] = {k: _piece(v, s, model.rank, model.world_size)
                        if s is not None and torch.is_tensor(v) and v.dim() > 0 else v
                        for k, v in entry.items()}
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def full_shapes(fsdp):
    """{name: full shape} of each entry of the plain module's state_dict, nothing gathered."""
    return {name: tuple(fsdp.shards_by_name[name].shape) if name in fsdp.shards_by_name
            else tuple(t.shape) for name, t in fsdp.module.state_dict().items()}
