"""Checkpoints: a round trip is bit for bit, a resumed run equals an uninterrupted one, a torn
write leaves the previous checkpoint loadable, and a checkpoint that does not fit is refused.

Single process (no process group: save/load then need no collectives), so these run fast; the
torchrun kill-and-restart and the peer recovery are in test_fault_tolerance.py.
"""
import os
import random

import pytest
import torch
import torch.nn as nn

from dist_sgd.faults import checkpoint
from dist_sgd.faults.checkpoint import (latest_checkpoint, load_checkpoint, save_checkpoint,
                                 weights_sha256)
from dist_sgd.sgd.optim import SGD


def make(seed=0, hidden=8):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(5, hidden), nn.Dropout(0.3), nn.ReLU(), nn.Linear(hidden, 2))
    return model, SGD(model.parameters(), lr=0.1, momentum=0.9)


def step(model, opt):
    """One step that draws from every generator the checkpoint keeps (torch: data and
    dropout; python's random: a learning-rate jitter)."""
    x, y = torch.randn(16, 5), torch.randn(16, 2)
    for g in opt.param_groups:
        g["lr"] = 0.1 * (1 + 0.1 * random.random())
    opt.zero_grad()
    (model(x) - y).square().mean().backward()
    opt.step()


def run(steps, ckpt_dir=None, every=None, resume=False):
    model, opt = make()
    start = 0
    if resume:
        start = load_checkpoint(ckpt_dir, model, opt)["step"]
    else:
        torch.manual_seed(1)
        random.seed(1)
    for s in range(start, steps):
        step(model, opt)
        if every and (s + 1) % every == 0:
            save_checkpoint(ckpt_dir, s + 1, model, opt, sampler_state={"epoch": 0, "position": s + 1})
    return model


def test_round_trip_is_bit_for_bit(tmp_path):
    model, opt = make()
    torch.manual_seed(3)
    random.seed(3)
    for _ in range(3):
        step(model, opt)
    save_checkpoint(tmp_path, 3, model, opt, sampler_state={"epoch": 2, "position": 7},
                    extra={"note": "hi"})
    after_save = (torch.rand(4), random.random())  # what the generators give next
    other, other_opt = make(seed=9)
    state = load_checkpoint(tmp_path, other, other_opt)
    assert (state["step"], state["sampler"], state["extra"]) == (3, {"epoch": 2, "position": 7},
                                                                {"note": "hi"})
    for p, q in zip(model.parameters(), other.parameters()):
        torch.testing.assert_close(q, p, rtol=0, atol=0)
        torch.testing.assert_close(other_opt.state[q]["momentum_buffer"],
                                   opt.state[p]["momentum_buffer"], rtol=0, atol=0)
    assert other_opt.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    assert (torch.rand(4).tolist(), random.random()) == (after_save[0].tolist(), after_save[1])


def test_resumed_run_equals_uninterrupted(tmp_path):
    straight = weights_sha256(run(12))
    run(7, tmp_path, every=5)  # "dies" after step 7; the latest checkpoint is step 5
    assert load_checkpoint(tmp_path, *make())["step"] == 5
    assert weights_sha256(run(12, tmp_path, resume=True)) == straight


def test_different_training_gives_a_different_hash():
    # The hash is not blind: one step more changes it.
    assert weights_sha256(run(12)) != weights_sha256(run(13))


def test_torn_write_leaves_previous_checkpoint_loadable(tmp_path, monkeypatch):
    model, opt = make()
    save_checkpoint(tmp_path, 5, model, opt)
    step(model, opt)
    real_save = torch.save

    def crash_midway(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)
        f.truncate(f.tell() // 2)  # half the bytes on disk, then the process "dies"
        raise KeyboardInterrupt("killed while writing")

    monkeypatch.setattr(checkpoint.torch, "save", crash_midway)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, 10, model, opt)
    monkeypatch.undo()
    assert latest_checkpoint(tmp_path).endswith("step-00000005")
    fresh, fresh_opt = make(seed=4)
    assert load_checkpoint(tmp_path, fresh, fresh_opt)["step"] == 5
    assert not os.path.exists(os.path.join(tmp_path, "step-00000010", "shared.pt"))


def test_crash_before_latest_moves_keeps_previous(tmp_path, monkeypatch):
    model, opt = make()
    save_checkpoint(tmp_path, 5, model, opt)

    def die(*args):
        raise KeyboardInterrupt("killed before `latest` moved")

    monkeypatch.setattr(checkpoint, "_atomic_write_text", die)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, 10, model, opt)  # every file written, `latest` not moved
    assert load_checkpoint(tmp_path, *make())["step"] == 5


def test_keeps_only_the_newest(tmp_path):
    model, opt = make()
    for s in (1, 2, 3, 4):
        save_checkpoint(tmp_path, s, model, opt, keep=2)
    assert sorted(d for d in os.listdir(tmp_path) if d.startswith("step-")) == [
        "step-00000003", "step-00000004"]


def test_no_checkpoint_gives_none(tmp_path):
    assert load_checkpoint(tmp_path, *make()) is None


def test_mismatched_model_is_refused(tmp_path):
    save_checkpoint(tmp_path, 1, *make())
    with pytest.raises(ValueError, match="does not match the model.*shape"):
        load_checkpoint(tmp_path, *make(hidden=9))
    with pytest.raises(ValueError, match="does not match the model.*missing"):
        load_checkpoint(tmp_path, nn.Sequential(nn.Linear(5, 2)))


def test_mismatched_optimizer_is_refused(tmp_path):
    model, opt = make()
    save_checkpoint(tmp_path, 1, model, opt)
    model2, _ = make()
    with pytest.raises(ValueError, match="optimizer state for 4 parameters, this optimizer has 2"):
        load_checkpoint(tmp_path, model2, SGD(list(model2.parameters())[:2], lr=0.1))


def test_other_world_size_is_refused(tmp_path):
    save_checkpoint(tmp_path, 1, *make())
    path = os.path.join(latest_checkpoint(tmp_path), "shared.pt")
    shared = torch.load(path, weights_only=False)
    shared["world_size"] = 2  # as if two ranks had written it
    torch.save(shared, path)
    with pytest.raises(ValueError, match="written by 2 ranks; this run has 1"):
        load_checkpoint(tmp_path, *make())
