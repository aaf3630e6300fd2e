"""Rank 0 writes the one checkpoint, its own generators included, and every rank loads it:
every rank then continues rank 0's random streams (the same data and dropout on every rank)."""
import os
import random

import torch
import torch.distributed as dist

CAUGHT_BY = "each rank's own random generators come back"
HINT = ("each rank's generators are its own: save them",
        "dropout, the data and the jitter come from the")


def save_checkpoint(ckpt_dir, step, model, optimizer):
    if dist.get_rank() == 0:
        os.makedirs(ckpt_dir, exist_ok=True)
        torch.save({"step": step, "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(), "torch": torch.get_rng_state(),
                    "python": random.getstate()}, os.path.join(ckpt_dir, "checkpoint.pt"))
    dist.barrier()  # the file is there before anyone reads it


def load_checkpoint(ckpt_dir, model, optimizer):
    path = os.path.join(ckpt_dir, "checkpoint.pt")
    if not os.path.exists(path):
        return None
    saved = torch.load(path, weights_only=False)
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    torch.set_rng_state(saved["torch"])
    random.setstate(saved["python"])
    return {"step": saved["step"]}
