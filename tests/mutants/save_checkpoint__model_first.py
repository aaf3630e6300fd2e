"""Loads the model's weights, then the optimizer's state: when the optimizer does not fit the
checkpoint (other parameters), torch's load_state_dict refuses it with a ValueError, but the
model has been changed already. The docstring promises a refusal that changes nothing: check
everything first, change after."""
import os
import random

import torch
import torch.distributed as dist
from dist_sgd.plumbing.rank import world
from dist_sgd.faults.checkpoint import (LATEST, RESEEDED, RESTORED, _atomic_save,
                                        _atomic_write_text, _barrier, _check_model,
                                        _check_optimizer, _checksums, _model_shapes, _read,
                                        _refusal, _remove_old, _restore, _snapshot,
                                        _write_checksums, full_model_state, full_optimizer_state,
                                        latest_checkpoint, load_full_model_state,
                                        load_full_optimizer_state, optimizer_kind, reseed,
                                        rng_state, set_rng_state, step_dir)


CAUGHT_BY = "an optimizer the checkpoint does not fit: ValueError, the model left as it was"
HINT = "check that everything fits before changing anything"


def save_checkpoint(ckpt_dir, step, model, optimizer=None, items=None, sampler_state=None,
                    extra=None, keep=2):
    """Write the checkpoint of `step` (collective: every rank calls it). Returns its folder.

    items: the global items consumed so far (the data position at any world size)."""
    rank, _ = world("save_checkpoint")
    name = f"step-{step:08d}"
    folder = os.path.join(ckpt_dir, name)
    os.makedirs(folder, exist_ok=True)
    state = rng_state()
    if rank == 0:
        torch.save({"step": step, "model": model.state_dict(),
                    "optimizer": None if optimizer is None else optimizer.state_dict()},
                   os.path.join(folder, "shared.pt"))
    torch.save(state, os.path.join(folder, f"rank-{rank}.pt"))
    dist.barrier()
    if rank == 0:
        with open(os.path.join(ckpt_dir, "latest.txt"), "w") as f:
            f.write(name)
    dist.barrier()
    return folder


def load_checkpoint(ckpt_dir, model, optimizer=None, restore_rng=True):
    """Load the latest checkpoint into model (and optimizer), at this run's world size.

    Returns {"step", "items", "saved_world_size", "resumed" (one sentence saying from where),
    "rng" ("restored" or "reseeded from (step, rank)"), "sampler", "extra", "path"}, or None
    when ckpt_dir holds no checkpoint. Raises ValueError on every rank, changing nothing, when
    it does not fit or is damaged.
    """
    rank, _ = world("load_checkpoint")
    path = os.path.join(ckpt_dir, "latest.txt")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        folder = os.path.join(ckpt_dir, f.read().strip())
    shared = torch.load(os.path.join(folder, "shared.pt"), weights_only=False)
    mine = torch.load(os.path.join(folder, f"rank-{rank}.pt"), weights_only=False)
    model.load_state_dict(shared["model"])
    if optimizer is not None:
        optimizer.load_state_dict(shared["optimizer"])
    set_rng_state(mine)
    return {"step": shared["step"]}
