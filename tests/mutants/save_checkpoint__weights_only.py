"""Saves the weights only (model.state_dict()): the momentum starts from zero again."""
import os
import random

import torch
import torch.distributed as dist

CAUGHT_BY = "saved, then loaded into a fresh model: weights, momentum, learning rate"
HINT = "the optimizer's state_dict() holds the momentum"


def _path(ckpt_dir):
    rank = dist.get_rank() if dist.is_initialized() else 0
    return os.path.join(ckpt_dir, f"rank-{rank}.pt")


def save_checkpoint(ckpt_dir, step, model, optimizer):
    os.makedirs(ckpt_dir, exist_ok=True)
    tmp = _path(ckpt_dir) + ".tmp"
    torch.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "torch": torch.get_rng_state(), "python": random.getstate()}, tmp)
    os.replace(tmp, _path(ckpt_dir))  # a crash mid-write leaves the previous one whole


def load_checkpoint(ckpt_dir, model, optimizer):
    if not os.path.exists(_path(ckpt_dir)):
        return None
    saved = torch.load(_path(ckpt_dir), weights_only=False)
    model.load_state_dict(saved["model"])
    torch.set_rng_state(saved["torch"])
    random.setstate(saved["python"])
    return {"step": saved["step"]}
