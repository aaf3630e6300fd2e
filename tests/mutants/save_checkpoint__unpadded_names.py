"""Names the folders step-{step} and finds the latest by sorting the names: as text
"step-10" < "step-9", so after step 10 the load goes back to step 9. Zero-padded names
(step-{step:08d}) sort as numbers, or the latest is named in a file of its own."""
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


CAUGHT_BY = "checkpoints of steps 9 and 10 in one folder: step 10 loads"
HINT = "\"step-10\" < \"step-9\" as text"


def save_checkpoint(ckpt_dir, step, model, optimizer=None, items=None, sampler_state=None,
                    extra=None, keep=2):
    """Write the checkpoint of `step` (collective: every rank calls it). Returns its folder.

    items: the global items consumed so far (the data position at any world size)."""
    rank, _ = world("save_checkpoint")
    name = f"step-{step}"
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
    names = sorted(n for n in os.listdir(ckpt_dir) if n.startswith("step-")) \
        if os.path.isdir(ckpt_dir) else []
    if not names:
        return None
    folder = os.path.join(ckpt_dir, names[-1])
    shared = torch.load(os.path.join(folder, "shared.pt"), weights_only=False)
    mine = torch.load(os.path.join(folder, f"rank-{rank}.pt"), weights_only=False)
    if optimizer is not None:
        trial = type(optimizer)([p.detach().clone() for g in optimizer.param_groups
                                 for p in g["params"]], **optimizer.defaults)
        trial.load_state_dict(shared["optimizer"])  # refuses what does not fit, first
    model.load_state_dict(shared["model"])
    if optimizer is not None:
        optimizer.load_state_dict(shared["optimizer"])
    set_rng_state(mine)
    return {"step": shared["step"]}
