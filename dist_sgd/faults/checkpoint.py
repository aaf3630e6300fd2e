"""Checkpoints that let a run continue: exactly at the same world size, at any other one too.

    save_checkpoint(ckpt_dir, step, model, optimizer, items=step * global_batch)
    state = load_checkpoint(ckpt_dir, model, optimizer)   # None when there is none yet
    if state: step, items = state["step"], state["items"]; log(state["resumed"])

Every rank calls both (they are collective when a process group exists). On disk:

    ckpt_dir/step-00000120/shared.pt        model + optimizer, whole; step, items, world size
    ckpt_dir/step-00000120/rank-1.pt        this rank's own: random generators, sampler, extra
    ckpt_dir/step-00000120/checksums.json   each file's sha256 and size, as written
    ckpt_dir/latest                         one line, "step-00000120": the checkpoint to load

What is shared is saved whole, in one process's layout, so any world size loads it; what is
per rank (the random generators) comes back only at the same world size (full_model_state's
and reseed's docstrings). A checkpoint that does not fit or is damaged is refused on every
rank before anything changes (_refusal's). Files are read with map_location="cpu" and copied
into the model's and optimizer's tensors wherever they live: saved on GPUs, loaded on a CPU,
and back. The files, written atomically and checked against checksums: checkpoint_files.py.
"""
import copy
import hashlib
import io
import os
import random

import torch
import torch.distributed as dist

from dist_sgd.faults.checkpoint_files import (  # the files, here too where tests import them
    CHECKSUMS, LATEST, _atomic_save, _atomic_write, _atomic_write_text, _checksums, _digest,
    _remove_old, _verified, _write_checksums, latest_checkpoint, step_dir)
from dist_sgd.plumbing.mine import swap_in
from dist_sgd.plumbing.rank import world
from dist_sgd.shard.fsdp import FullyShardedDataParallel
from dist_sgd.shard.fsdp_io import (full_optim_state_dict, full_shapes,
                                    load_full_optim_state_dict, optim_state_problems)

RESTORED = "restored"
RESEEDED = "reseeded from (step, rank)"


def _barrier():
    """Wait for every rank (nothing to wait for outside a process group)."""
    if dist.is_initialized():
        dist.barrier()


def _unwrap(model):
    """A DDP wrapper (ours or torch's) keeps the real model in .module: save that, so a
    checkpoint loads with or without the wrapper. A sharded wrapper (FullyShardedDataParallel)
    stays: its own state_dict() is the full one, its .module holds this rank's pieces only."""
    return model if _sharded(model) else getattr(model, "module", model)


def _sharded(model):
    return isinstance(model, FullyShardedDataParallel)


def rng_state():
    """Every random generator a training run here draws from."""
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy as np  # noqa: PLC0415 - only if the run has numpy at all
        state["numpy"] = np.random.get_state()
    except ImportError:
        pass
    return state


def set_rng_state(state):
    """Put back every random generator rng_state() saved: Python's, torch's CPU one, the
    GPUs' (when saved and present) and NumPy's (when saved)."""
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy as np  # noqa: PLC0415
        np.random.set_state(state["numpy"])


def reseed(step, rank):
    """Seed every generator from (step, rank): what a rank of a new world size starts from.

    What is per rank cannot carry over to another world size: rank r's random generators continue
    a stream that belonged to one rank of the old split. So at the same world size every rank
    restores its own generators (a resumed run is bit for bit the uninterrupted one), and at
    another world size none is restored: every rank's generators are seeded from (step, rank)
    instead (state["rng"] says which), deterministic for a given (step, rank). The per-rank
    `sampler` and `extra` then come back as None. Training whose every random draw is a function
    of (step, rank), or of the global item, loses nothing by that; a resumed run then differs from
    an uninterrupted one only by the float rounding of sums split another way.
    """
    seed = (1_000_003 * step + rank) % 2 ** 31
    random.seed(seed)
    torch.manual_seed(seed)  # the CUDA generators too
    try:
        import numpy as np  # noqa: PLC0415
        np.random.seed(seed)
    except ImportError:
        pass


# ---- what is shared, whole: the plug-in points for sharded models and optimizers -----------

def full_model_state(model):
    """The model's whole state_dict (every rank calls this: gathering shards is collective).

    What is shared is saved whole, in the layout of one process: the model's full state_dict and
    the optimizer's plain state_dict (a ZeRO-1 optimizer's shards consolidated on rank 0 first,
    torch's consolidate_state_dict(to=0) idiom). So any world size can load it: every rank reads
    the whole file and keeps what it needs (ShardedOptimizer.load_state_dict keeps its shard).
    The data position is saved as `items`, the number of global items consumed: with the global
    batch fixed, each rank re-derives its share of the next batch at the new world size.

    FullyShardedDataParallel: each rank holds pieces of the weights and of the optimizer state (the
    momentum, Adam's moments), so both go in and out full (dist_sgd.shard.fsdp_io: the pieces
    gathered on the way out, each rank's cut again on the way in), as torch's
    get_state_dict / set_state_dict with full_state_dict=True: the same file as the plain model's,
    loadable at any world size. `full_model_state` / `full_optimizer_state` and their loaders are
    where another sharded model would plug in.
    """
    return _unwrap(model).state_dict()


def load_full_model_state(model, state):
    """Load a whole state_dict into the model (unwrapped from DDP; a sharded model keeps its
    own piece of each tensor)."""
    _unwrap(model).load_state_dict(state)


def full_optimizer_state(model, optimizer, rank):
    """The optimizer's plain state_dict on rank 0, None elsewhere (every rank calls this).
    A sharded optimizer (ours, torch's ZeroRedundancyOptimizer) consolidates on rank 0 first;
    the optimizer of a FullyShardedDataParallel holds pieces: gathered to full on every rank."""
    if _sharded(model):
        state = full_optim_state_dict(model, optimizer)
        return state if rank == 0 else None
    if hasattr(optimizer, "consolidate_state_dict"):
        optimizer.consolidate_state_dict(to=0)
    return optimizer.state_dict() if rank == 0 else None


def load_full_optimizer_state(model, optimizer, state):
    """Each rank keeps what it needs of the whole (a shard, FSDP's pieces, or everything)."""
    if _sharded(model):
        load_full_optim_state_dict(model, optimizer, state)
    else:
        optimizer.load_state_dict(state)


def optimizer_kind(optimizer):
    """The name of the optimizer that holds the state (inside a sharding wrapper: the wrapped
    one's): an SGD's state does not fit an Adam."""
    return type(getattr(optimizer, "optim", optimizer)).__name__


def save_checkpoint(ckpt_dir, step, model, optimizer=None, items=None, sampler_state=None,
                    extra=None, keep=2):
    """Write the checkpoint of `step` (collective: every rank calls it). Returns its folder.

    items: the global items consumed so far (the data position at any world size)."""
    # ---- exercise save_checkpoint: save model, optimizer, step and this rank's generators
    rank, world_size = world()
    folder = step_dir(ckpt_dir, step)
    os.makedirs(folder, exist_ok=True)
    model_state = full_model_state(model)  # collective pieces first, on every rank
    opt_state = full_optimizer_state(model, optimizer, rank) if optimizer is not None else None
    written = {}
    if rank == 0:
        written["shared.pt"] = _atomic_save(
            {"step": step, "items": items, "world_size": world_size, "model": model_state,
             "optimizer": opt_state,
             "optimizer_kind": optimizer_kind(optimizer) if optimizer else None},
            os.path.join(folder, "shared.pt"))
    written[f"rank-{rank}.pt"] = _atomic_save(
        {"rank": rank, "rng": rng_state(), "sampler": sampler_state, "extra": extra},
        os.path.join(folder, f"rank-{rank}.pt"))
    every = [written]
    if dist.is_initialized():  # each rank's files are written once it hands their checksums
        every = [None] * world_size if rank == 0 else None
        dist.gather_object(written, every, dst=0)
    if rank == 0:
        _write_checksums(folder, {name: entry for files in every for name, entry in files.items()})
    _barrier()  # every rank's files and the checksums are in place before `latest` may move
    if rank == 0:
        _atomic_write_text(os.path.basename(folder) + "\n", os.path.join(ckpt_dir, LATEST))
        _remove_old(ckpt_dir, keep)
    _barrier()  # nobody reads `latest` (or leaves) before it moved
    return folder
    # ---- end of exercise


def _read(path, listed):
    """The object in a checkpoint file, once its bytes are the ones save_checkpoint wrote."""
    data = _verified(path, listed)
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
    except Exception as e:  # noqa: BLE001 - the bytes as written, yet not a checkpoint
        raise ValueError(f"checkpoint file {path} is damaged or not written by save_checkpoint: "
                         f"{type(e).__name__}: {str(e).splitlines()[0][:200]}") from e


# ---- checks: every one before anything is loaded ----------------------------------------------

def _model_shapes(model):
    """{name: full shape} of every entry of the model's state_dict, nothing gathered."""
    if _sharded(model):
        return full_shapes(model)
    return {name: tuple(t.shape) for name, t in _unwrap(model).state_dict().items()}


def _check_model(own, saved):
    """A ValueError unless the saved state_dict has the model's names and shapes (own: name ->
    shape, from _model_shapes)."""
    missing, unexpected = sorted(set(own) - set(saved)), sorted(set(saved) - set(own))
    if missing or unexpected:
        raise ValueError(f"checkpoint does not match the model: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    for name, shape in own.items():
        if tuple(saved[name].shape) != shape:
            raise ValueError(f"checkpoint does not match the model: {name} has shape "
                             f"{tuple(saved[name].shape)} there, {shape} here")


def _check_optimizer(model, optimizer, shared, folder):
    """A ValueError unless the checkpoint's optimizer state (shared['optimizer']) was saved by
    the same kind of optimizer, for as many parameters in the same groups."""
    saved = shared["optimizer"]
    if saved is None:
        raise ValueError(f"checkpoint {folder} holds no optimizer state")
    kind = optimizer_kind(optimizer)
    if shared.get("optimizer_kind") not in (None, kind):
        raise ValueError(f"checkpoint {folder} was saved with {shared['optimizer_kind']}; this "
                         f"optimizer is {kind}: its state would not fit")
    have = [len(g["params"]) for g in optimizer.param_groups]
    got = [len(g["params"]) for g in saved["param_groups"]]
    if sum(have) != sum(got):
        raise ValueError(f"checkpoint {folder} has optimizer state for {sum(got)} parameters, "
                         f"this optimizer has {sum(have)}")
    if have != got:
        raise ValueError(f"checkpoint {folder} has parameter groups of {got} parameters, this "
                         f"optimizer has {have}")
    if _sharded(model):  # the state must be whole: each rank cuts its pieces from it
        problems = optim_state_problems(model, optimizer, saved)
        if problems:
            raise ValueError(f"checkpoint {folder}: " + "; ".join(problems))
        return
    params = [p for g in optimizer.param_groups for p in g["params"]]
    for i, entry in saved["state"].items():
        for key, value in entry.items():
            if torch.is_tensor(value) and value.dim() > 0 and value.shape != params[i].shape:
                raise ValueError(f"checkpoint {folder}: optimizer state {key!r} of parameter {i} "
                                 f"has shape {tuple(value.shape)}, the parameter "
                                 f"{tuple(params[i].shape)}")


def _refusal(error):
    """None when no rank found an error, else the one message every rank raises (a collective
    when a group exists: one rank's refusal is every rank's).

    A checkpoint that does not fit is refused before anything changes, with the reason: a model
    with other parameter names or shapes, an optimizer of another kind or size, a damaged file
    (named). Damaged: torch.load checks no checksum (a flipped byte in a tensor loads as a wrong
    weight), so every file is read whole and its sha256 and size compared with checksums.json
    first. Each rank checks what it reads (the shared file, its own), then the ranks compare: one
    rank's refusal is every rank's, before any rank loads anything. As a last guard, a load that
    fails half-way (an optimizer raising on the saved state) on any rank puts every rank's model
    and optimizer back.
    """
    rank, world_size = world()
    if not dist.is_initialized() or world_size == 1:
        return error
    errors = [None] * world_size
    dist.all_gather_object(errors, error)
    failed = [(r, e) for r, e in enumerate(errors) if e is not None]
    if not failed:
        return None
    who = ("every rank" if len(failed) == world_size else
           "rank " + ", ".join(str(r) for r, _ in failed))
    return f"{failed[0][1]} (found on {who}: every rank refuses)"


def _snapshot(model, optimizer):
    """What this rank holds (FSDP: its own pieces), to put back; nothing gathered."""
    local = model.module if _sharded(model) else _unwrap(model)
    weights = {k: v.detach().clone() for k, v in local.state_dict().items()}
    if optimizer is None:
        return local, weights, None
    opts = [optimizer] + [o for o in [getattr(optimizer, "optim", None)] if o is not None]
    state = [{p: {k: v.clone() if torch.is_tensor(v) else copy.deepcopy(v)
                  for k, v in entry.items()} for p, entry in o.state.items()} for o in opts]
    groups = [[{k: v for k, v in g.items() if k != "params"} for g in o.param_groups]
              for o in opts]
    return local, weights, (opts, state, groups)


def _restore(snapshot):
    """Put back what _snapshot took: the weights, the optimizer's state and its groups' options."""
    local, weights, held = snapshot
    with torch.no_grad():
        local.load_state_dict(weights)
    for o, state, groups in zip(*held) if held else []:
        o.state.clear()  # load_state_dict may have replaced the dict: clear the one it holds
        o.state.update(state)
        for g, h in zip(o.param_groups, groups):
            g.update(h)


def load_checkpoint(ckpt_dir, model, optimizer=None, restore_rng=True):
    """Load the latest checkpoint into model (and optimizer), at this run's world size.

    Returns {"step", "items", "saved_world_size", "resumed" (one sentence saying from where),
    "rng" ("restored" or "reseeded from (step, rank)"), "sampler", "extra", "path"}, or None
    when ckpt_dir holds no checkpoint. Raises ValueError on every rank, changing nothing, when
    it does not fit or is damaged.

    restore_rng=True: every random generator as it was at the save (same world size), or
    reseeded from (step, rank) (another world size: the saved per-rank states do not fit).
    restore_rng=False: the generators are left as they are (the caller seeds them) and "rng"
    is None.
    """
    # ---- exercise save_checkpoint: load the latest back (model, optimizer, generators)
    folder = latest_checkpoint(ckpt_dir)
    if folder is None:
        return None
    rank, world_size = world()
    shared = own = error = None
    try:  # every check on every rank, then the ranks compare: before anything is loaded
        listed = _checksums(folder)
        shared = _read(os.path.join(folder, "shared.pt"), listed)
        _check_model(_model_shapes(model), shared["model"])
        if optimizer is not None:
            _check_optimizer(model, optimizer, shared, folder)
        if shared["world_size"] == world_size:
            own = _read(os.path.join(folder, f"rank-{rank}.pt"), listed)
    except Exception as e:  # noqa: BLE001 - a refusal, said on every rank
        error = str(e) if isinstance(e, ValueError) else f"checkpoint {folder}: {e!r}"
    refused = _refusal(error)
    if refused:
        raise ValueError(refused)
    same = shared["world_size"] == world_size
    snapshot, what = _snapshot(model, optimizer), "model"
    try:
        load_full_model_state(model, shared["model"])
        if optimizer is not None:
            what = "optimizer"
            load_full_optimizer_state(model, optimizer, shared["optimizer"])
    except Exception as e:  # noqa: BLE001 - put everything back, on every rank, then say why
        error = f"checkpoint {folder} does not fit this {what} ({type(e).__name__}: {e})"
    refused = _refusal(error)
    if refused:
        _restore(snapshot)
        raise ValueError(f"{refused}; the model and the optimizer were left as they were")
    rng = None
    if restore_rng:
        rng = RESTORED if same else RESEEDED
        set_rng_state(own["rng"]) if same else reseed(shared["step"], rank)
    saved_at = shared["world_size"]
    resumed = f"resumed from step {shared['step']}, saved at world size {saved_at}"
    return {"step": shared["step"], "items": shared.get("items"), "saved_world_size": saved_at,
            "resumed": resumed + ("" if same else f", now {world_size}"), "rng": rng,
            "sampler": own["sampler"] if same else None, "extra": own["extra"] if same else None,
            "path": folder}
    # ---- end of exercise


def weights_sha256(model):
    """One hash over every parameter, in order, as raw bytes: equal hashes, equal weights."""
    h = hashlib.sha256()
    for p in _unwrap(model).parameters():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


# DIST_SGD_MINE: a learner's version replaces ours
swap_in(globals(), "save_checkpoint", ("save_checkpoint", "load_checkpoint"), lesson="14")
