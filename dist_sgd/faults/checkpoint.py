"""Checkpoints that let a run continue: exactly at the same world size, at any other one too.

    save_checkpoint(ckpt_dir, step, model, optimizer, items=step * global_batch)
    state = load_checkpoint(ckpt_dir, model, optimizer)   # None when there is none yet
    if state: step, items = state["step"], state["items"]; log(state["resumed"])

Every rank calls both (they are collective when a process group exists). On disk:

    ckpt_dir/step-00000120/shared.pt     model + optimizer, whole; step, items, world size
    ckpt_dir/step-00000120/rank-1.pt     this rank's own: random generators, sampler, extra
    ckpt_dir/latest                      one line, "step-00000120": the checkpoint to load

What is shared is saved whole, in the layout of one process: the model's full state_dict and
the optimizer's plain state_dict (a ZeRO-1 optimizer's shards consolidated on rank 0 first,
torch's consolidate_state_dict(to=0) idiom). So any world size can load it: every rank reads
the whole file and keeps what it needs (ShardedOptimizer.load_state_dict keeps its shard).
The data position is saved as `items`, the number of global items consumed: with the global
batch fixed, each rank re-derives its share of the next batch at the new world size.

What is per rank cannot carry over to another world size: rank r's random generators continue
a stream that belonged to one rank of the old split. So at the same world size every rank
restores its own generators (a resumed run is bit for bit the uninterrupted one), and at
another world size none is restored: every rank's generators are seeded from (step, rank)
instead (state["rng"] says which), deterministic for a given (step, rank). The per-rank
`sampler` and `extra` then come back as None. Training whose every random draw is a function
of (step, rank), or of the global item, loses nothing by that; a resumed run then differs from
an uninterrupted one only by the float rounding of sums split another way.

Atomic: every file is written to a temporary name and renamed (a rename within one filesystem
is atomic), and `latest` moves to the new step only after every rank has finished writing (a
barrier), again by a rename. The previous checkpoint stays loadable until then; older ones
beyond `keep` are removed after.

A checkpoint that does not fit is refused before anything changes, with the reason: a model
with other parameter names or shapes, an optimizer of another kind or size, a damaged file
(named). Every rank reads the same file, so every rank refuses alike. As a last guard, a load
that fails half-way (an optimizer raising on the saved state) puts the model's weights back.

FSDP (or any model whose weights are sharded): gather them into a full state_dict on every rank
in `full_model_state` and load the full one in `load_full_model_state` (torch's
get_model_state_dict / set_model_state_dict with full_state_dict=True); the optimizer's
consolidated state plugs in through `full_optimizer_state` the same way. The file format stays.
"""
import hashlib
import os
import random
import shutil

import torch
import torch.distributed as dist

from dist_sgd.plumbing.rank import world

LATEST = "latest"
RESTORED, RESEEDED = "restored", "reseeded from (step, rank)"


def _barrier():
    if dist.is_initialized():
        dist.barrier()


def _unwrap(model):
    """A DDP wrapper (ours or torch's) keeps the real model in .module: save that, so a
    checkpoint loads with or without the wrapper. A sharded wrapper (FullyShardedDataParallel)
    stays: its own state_dict() is the full one, its .module holds this rank's pieces only."""
    return model if hasattr(model, "gather_full_params") else getattr(model, "module", model)


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
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy as np  # noqa: PLC0415
        np.random.set_state(state["numpy"])


def reseed(step, rank):
    """Seed every generator from (step, rank): what a rank of a new world size starts from."""
    seed = (1_000_003 * step + rank) % 2 ** 31
    random.seed(seed)
    torch.manual_seed(seed)  # the CUDA generators too
    try:
        import numpy as np  # noqa: PLC0415
        np.random.seed(seed)
    except ImportError:
        pass


def _atomic_save(obj, path):
    """torch.save to a temporary name, flushed to disk, then renamed into place."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _atomic_write_text(text, path):
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def step_dir(ckpt_dir, step):
    return os.path.join(ckpt_dir, f"step-{step:08d}")


# ---- what is shared, whole: the plug-in points for sharded models and optimizers -----------

def full_model_state(model):
    """The model's whole state_dict (every rank calls this: gathering shards is collective)."""
    return _unwrap(model).state_dict()


def load_full_model_state(model, state):
    _unwrap(model).load_state_dict(state)


def full_optimizer_state(optimizer, rank):
    """The optimizer's plain state_dict on rank 0, None elsewhere (every rank calls this).
    A sharded optimizer (ours, torch's ZeroRedundancyOptimizer) consolidates on rank 0 first."""
    if hasattr(optimizer, "consolidate_state_dict"):
        optimizer.consolidate_state_dict(to=0)
    return optimizer.state_dict() if rank == 0 else None


def optimizer_kind(optimizer):
    """The name of the optimizer that holds the state (inside a sharding wrapper: the wrapped
    one's): an SGD's state does not fit an Adam."""
    return type(getattr(optimizer, "optim", optimizer)).__name__


def save_checkpoint(ckpt_dir, step, model, optimizer=None, items=None, sampler_state=None,
                    extra=None, keep=2):
    """Write the checkpoint of `step` (collective: every rank calls it). Returns its folder.

    items: the global items consumed so far (the data position at any world size)."""
    rank, world_size = world()
    folder = step_dir(ckpt_dir, step)
    os.makedirs(folder, exist_ok=True)
    model_state = full_model_state(model)  # collective pieces first, on every rank
    opt_state = full_optimizer_state(optimizer, rank) if optimizer is not None else None
    if rank == 0:
        _atomic_save({"step": step, "items": items, "world_size": world_size,
                      "model": model_state, "optimizer": opt_state,
                      "optimizer_kind": optimizer_kind(optimizer) if optimizer else None},
                     os.path.join(folder, "shared.pt"))
    _atomic_save({"rank": rank, "rng": rng_state(), "sampler": sampler_state, "extra": extra},
                 os.path.join(folder, f"rank-{rank}.pt"))
    _barrier()  # every rank's files are in place before `latest` may point at them
    if rank == 0:
        _atomic_write_text(os.path.basename(folder) + "\n", os.path.join(ckpt_dir, LATEST))
        _remove_old(ckpt_dir, keep)
    _barrier()  # nobody reads `latest` (or leaves) before it moved
    return folder


def _remove_old(ckpt_dir, keep):
    steps = sorted(d for d in os.listdir(ckpt_dir) if d.startswith("step-"))
    latest = latest_checkpoint(ckpt_dir)
    for name in steps[:-keep] if keep else []:
        if os.path.join(ckpt_dir, name) != latest:
            shutil.rmtree(os.path.join(ckpt_dir, name), ignore_errors=True)


def latest_checkpoint(ckpt_dir):
    """The folder `latest` names, or None when nothing was completely written yet."""
    try:
        with open(os.path.join(ckpt_dir, LATEST)) as f:
            name = f.read().strip()
    except FileNotFoundError:
        return None
    return os.path.join(ckpt_dir, name)


def _read(path):
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # noqa: BLE001 - truncated, empty, not a checkpoint: all "damaged"
        raise ValueError(f"checkpoint file {path} is damaged or incomplete (truncated, empty or "
                         f"not written by save_checkpoint): {type(e).__name__}: "
                         f"{str(e).splitlines()[0][:200]}") from e


# ---- checks: every one before anything is loaded ----------------------------------------------

def _check_model(model, saved):
    own = model.state_dict()
    missing, unexpected = sorted(set(own) - set(saved)), sorted(set(saved) - set(own))
    if missing or unexpected:
        raise ValueError(f"checkpoint does not match the model: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    for name, tensor in own.items():
        if tensor.shape != saved[name].shape:
            raise ValueError(f"checkpoint does not match the model: {name} has shape "
                             f"{tuple(saved[name].shape)} there, {tuple(tensor.shape)} here")


def _check_optimizer(optimizer, shared, folder):
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
    params = [p for g in optimizer.param_groups for p in g["params"]]
    for i, entry in saved["state"].items():
        for key, value in entry.items():
            if torch.is_tensor(value) and value.dim() > 0 and value.shape != params[i].shape:
                raise ValueError(f"checkpoint {folder}: optimizer state {key!r} of parameter {i} "
                                 f"has shape {tuple(value.shape)}, the parameter "
                                 f"{tuple(params[i].shape)}")


def load_checkpoint(ckpt_dir, model, optimizer=None, restore_rng=True):
    """Load the latest checkpoint into model (and optimizer), at this run's world size.

    Returns {"step", "items", "saved_world_size", "resumed" (one sentence saying from where),
    "rng" ("restored" or "reseeded from (step, rank)"), "sampler", "extra", "path"}, or None
    when ckpt_dir holds no checkpoint. Raises ValueError, changing nothing, when it does not fit.
    """
    folder = latest_checkpoint(ckpt_dir)
    if folder is None:
        return None
    rank, world_size = world()
    shared = _read(os.path.join(folder, "shared.pt"))
    target = _unwrap(model)
    _check_model(target, shared["model"])
    if optimizer is not None:
        _check_optimizer(optimizer, shared, folder)
    same = shared["world_size"] == world_size
    own = _read(os.path.join(folder, f"rank-{rank}.pt")) if same else None
    before = {k: v.clone() for k, v in target.state_dict().items()}
    try:
        load_full_model_state(model, shared["model"])
        if optimizer is not None:
            optimizer.load_state_dict(shared["optimizer"])
    except Exception as e:  # noqa: BLE001 - put the weights back, then say why
        target.load_state_dict(before)
        raise ValueError(f"checkpoint {folder} does not fit this optimizer ({type(e).__name__}: "
                         f"{e}); the model was left as it was") from e
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


def weights_sha256(model):
    """One hash over every parameter, in order, as raw bytes: equal hashes, equal weights."""
    h = hashlib.sha256()
    for p in _unwrap(model).parameters():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()
