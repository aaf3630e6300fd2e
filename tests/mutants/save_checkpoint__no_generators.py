"""Saves the model, the optimizer and the step, not the random generators: the resumed
run draws other data, dropout masks and jitter."""
import os

import torch
import torch.distributed as dist

CAUGHT_BY = "killed after step 3 of 6 and resumed: the uninterrupted run's weights"
HINT = "dropout, the data and the jitter come from"


def _path(ckpt_dir):
    rank = dist.get_rank() if dist.is_initialized() else 0
    return os.path.join(ckpt_dir, f"rank-{rank}.pt")


def save_checkpoint(ckpt_dir, step, model, optimizer):
    os.makedirs(ckpt_dir, exist_ok=True)
    tmp = _path(ckpt_dir) + ".tmp"
    torch.save({"step": step, "model": model.state_dict(),
                "optimizer": optimizer.state_dict()}, tmp)
    os.replace(tmp, _path(ckpt_dir))  # a crash mid-write leaves the previous one whole


def load_checkpoint(ckpt_dir, model, optimizer):
    if not os.path.exists(_path(ckpt_dir)):
        return None
    saved = torch.load(_path(ckpt_dir), weights_only=False)
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    return {"step": saved["step"]}
