"""Checkpoints that let a run continue exactly: model, optimizer, step, sampler, random state.

    save_checkpoint(ckpt_dir, step, model, optimizer, sampler_state={"epoch": e, "position": i})
    state = load_checkpoint(ckpt_dir, model, optimizer)   # None when there is none yet
    if state: step = state["step"]; sampler_state = state["sampler"]

Every rank calls both (they are collective when a process group exists). On disk:

    ckpt_dir/step-00000120/shared.pt     model + optimizer + step (+ world size), from rank 0
    ckpt_dir/step-00000120/rank-1.pt     this rank's own: random generators, sampler, extra
    ckpt_dir/latest                      one line, "step-00000120": the checkpoint to load

Why this shape. Under data parallelism every rank holds the same model and optimizer state, so
rank 0 writes it once; but random generators differ per rank (each draws its own dropout
masks) and so may the sampler, so each rank writes its own small file. A run killed while
writing must never leave a half-written checkpoint as the latest: every file is written to a
temporary name and renamed (a rename within one filesystem is atomic), and `latest` moves to
the new step only after every rank has finished writing (a barrier), again by a rename. The
previous checkpoint stays loadable until then; older ones beyond `keep` are removed after.

A checkpoint that does not fit is refused with a clear error, not half-loaded: another world
size (the per-rank files would not match the ranks), a model with other parameter names or
shapes, an optimizer with another number of parameters.
"""
import hashlib
import os
import random
import shutil

import torch
import torch.distributed as dist

from dist_sgd.plumbing.rank import world

LATEST = "latest"


def _barrier():
    if dist.is_initialized():
        dist.barrier()


def _unwrap(model):
    """A DDP wrapper (ours or torch's) keeps the real model in .module: save that, so a
    checkpoint loads with or without the wrapper."""
    return getattr(model, "module", model)


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


def save_checkpoint(ckpt_dir, step, model, optimizer=None, sampler_state=None, extra=None,
                    keep=2):
    """Write the checkpoint of `step` (collective: every rank calls it). Returns its folder."""
    rank, world_size = world()
    folder = step_dir(ckpt_dir, step)
    os.makedirs(folder, exist_ok=True)
    if rank == 0:
        _atomic_save({"step": step, "world_size": world_size,
                      "model": _unwrap(model).state_dict(),
                      "optimizer": optimizer.state_dict() if optimizer is not None else None},
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


def load_checkpoint(ckpt_dir, model, optimizer=None, restore_rng=True):
    """Load the latest checkpoint into model (and optimizer) and this rank's random state.

    Returns {"step", "sampler", "extra", "path"}, or None when ckpt_dir holds no checkpoint."""
    folder = latest_checkpoint(ckpt_dir)
    if folder is None:
        return None
    rank, world_size = world()
    shared = torch.load(os.path.join(folder, "shared.pt"), map_location="cpu", weights_only=False)
    if shared["world_size"] != world_size:
        raise ValueError(f"checkpoint {folder} was written by {shared['world_size']} ranks; this "
                         f"run has {world_size}: its per-rank state (random generators, sampler) "
                         f"would not match")
    target = _unwrap(model)
    _check_model(target, shared["model"])
    target.load_state_dict(shared["model"])
    if optimizer is not None:
        saved = shared["optimizer"]
        if saved is None:
            raise ValueError(f"checkpoint {folder} holds no optimizer state")
        have = sum(len(g["params"]) for g in optimizer.param_groups)
        got = sum(len(g["params"]) for g in saved["param_groups"])
        if have != got:
            raise ValueError(f"checkpoint {folder} has optimizer state for {got} parameters, "
                             f"this optimizer has {have}")
        optimizer.load_state_dict(saved)
    own = torch.load(os.path.join(folder, f"rank-{rank}.pt"), map_location="cpu", weights_only=False)
    if restore_rng:
        set_rng_state(own["rng"])
    return {"step": shared["step"], "sampler": own["sampler"], "extra": own["extra"],
            "path": folder}


def weights_sha256(model):
    """One hash over every parameter, in order, as raw bytes: equal hashes, equal weights."""
    h = hashlib.sha256()
    for p in _unwrap(model).parameters():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()
