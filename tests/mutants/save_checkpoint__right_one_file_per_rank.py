"""A correct version written from scratch: every rank writes one file of its own (the model
and the optimizer are the same on every rank) and reads it back."""
import copy
import os
import random

import torch
import torch.distributed as dist


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
    copy.deepcopy(optimizer).load_state_dict(saved["optimizer"])  # refused before any change
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    torch.set_rng_state(saved["torch"])
    random.setstate(saved["python"])
    return {"step": saved["step"]}
