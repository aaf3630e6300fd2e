"""Checkpoints: a round trip is bit for bit, a resumed run equals an uninterrupted one, a torn
write leaves the previous checkpoint loadable, and a checkpoint that does not fit is refused.

Single process (no process group: save/load then need no collectives), so these run fast; the
torchrun kill-and-restart and the peer recovery are in test_fault_tolerance.py.
"""
import copy
import hashlib
import os
import random
import re
import shutil
import struct
import zipfile

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


def flip_byte(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x55]))


def tensor_data_offset(path):
    """The offset of a byte in the middle of the largest tensor a torch.save file holds."""
    with zipfile.ZipFile(path) as z:
        info = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        name_len, extra_len = struct.unpack("<HH", f.read(30)[26:30])
    return info.header_offset + 30 + name_len + extra_len + info.file_size // 2


def rewrite(folder, name, change):
    """Change what a checkpoint file holds and write it again, with its checksum: a checkpoint
    as another save_checkpoint would have written it."""
    path = os.path.join(folder, name)
    obj = torch.load(path, weights_only=False)
    change(obj)
    torch.save(obj, path)
    with open(path, "rb") as f:
        data = f.read()
    listed = checkpoint._checksums(folder)
    listed[name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    checkpoint._write_checksums(folder, listed)


def test_other_world_size_loads_and_says_so(tmp_path):
    save_checkpoint(tmp_path, 1, *make())
    rewrite(latest_checkpoint(tmp_path), "shared.pt",
            lambda shared: shared.update(world_size=2))  # as if two ranks had written it
    state = load_checkpoint(tmp_path, *make())
    assert state["resumed"] == "resumed from step 1, saved at world size 2, now 1"
    assert state["rng"] == "reseeded from (step, rank)" and state["sampler"] is None
    first = torch.rand(3)
    load_checkpoint(tmp_path, *make())  # reseeded the same way again: the same draws
    assert torch.equal(torch.rand(3), first)


# ---- a refused checkpoint changes nothing ----------------------------------------------------

def weights(model):
    return [p.detach().clone() for p in model.parameters()]


def assert_untouched(model, before):
    for p, q in zip(model.parameters(), before):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_optimizer_of_another_size_is_refused_before_the_model_changes(tmp_path):
    model, opt = make()
    step(model, opt)
    save_checkpoint(tmp_path, 1, model, opt)
    other, _ = make(seed=5)
    before = weights(other)
    with pytest.raises(ValueError, match="optimizer state for 4 parameters, this optimizer has 2"):
        load_checkpoint(tmp_path, other, SGD(list(other.parameters())[:2], lr=0.1))
    assert_untouched(other, before)


def test_optimizer_of_another_kind_is_refused_and_named(tmp_path):
    model, opt = make()
    step(model, opt)  # SGD with momentum: a momentum buffer per parameter, no "step"
    save_checkpoint(tmp_path, 1, model, opt)
    other, _ = make(seed=5)
    before = weights(other)
    adam = torch.optim.Adam(other.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="saved with SGD.*this optimizer is Adam"):
        load_checkpoint(tmp_path, other, adam)
    assert_untouched(other, before)
    assert adam.state_dict()["state"] == {}  # the optimizer is untouched too


def test_a_failing_optimizer_load_rolls_the_model_back(tmp_path, monkeypatch):
    model, opt = make()
    step(model, opt)
    save_checkpoint(tmp_path, 1, model, opt)
    other, other_opt = make(seed=5)
    before = weights(other)

    def broken(state_dict):
        raise KeyError("something this optimizer needs")

    monkeypatch.setattr(other_opt, "load_state_dict", broken)
    with pytest.raises(ValueError, match="does not fit this optimizer.*something this optimizer"):
        load_checkpoint(tmp_path, other, other_opt)
    assert_untouched(other, before)


@pytest.mark.parametrize("damage", ["truncated", "empty"])
def test_a_damaged_file_is_named(tmp_path, damage):
    model, opt = make()
    save_checkpoint(tmp_path, 1, model, opt)
    path = os.path.join(latest_checkpoint(tmp_path), "shared.pt")
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2 if damage == "truncated" else 0)
    other, other_opt = make(seed=5)
    before = weights(other)
    with pytest.raises(ValueError, match=f"{path}.*damaged"):
        load_checkpoint(tmp_path, other, other_opt)
    assert_untouched(other, before)


def zip_entry_offset(path, name_end):
    """The offset of the first byte of the data of the zip entry whose name ends so."""
    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if i.filename.endswith(name_end))
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        name_len, extra_len = struct.unpack("<HH", f.read(30)[26:30])
    return info.header_offset + 30 + name_len + extra_len


def pickle_offset(path):
    return zip_entry_offset(path, "data.pkl") + 20


DAMAGES = {  # file: where its byte is flipped (a function of the file's path)
    "shared.pt": {"zip header": lambda p: 0, "pickle": pickle_offset,
                  "tensor data": tensor_data_offset, "last byte": lambda p: os.path.getsize(p) - 1},
    "rank-0.pt": {"tensor data": tensor_data_offset, "pickle": pickle_offset},
    "checksums.json": {"a digit of a file's sha256": lambda p: open(p).read().index("sha256") + 12,
                       "first byte": lambda p: 0},
}


@pytest.mark.parametrize("name,where", [(n, w) for n, ws in DAMAGES.items() for w in ws])
def test_a_flipped_byte_anywhere_is_refused_and_changes_nothing(tmp_path, name, where):
    # torch.load checks no checksum: a flipped byte in a tensor's data loads as a wrong weight.
    model, opt = make()
    step(model, opt)
    save_checkpoint(tmp_path, 1, model, opt)
    path = os.path.join(latest_checkpoint(tmp_path), name)
    flip_byte(path, DAMAGES[name][where](path))
    other, other_opt = make(seed=5)
    step(other, other_opt)
    before = (weights(other), copy.deepcopy(other_opt.state_dict()))
    with pytest.raises(ValueError, match=re.escape(path) + ".*damaged"):
        load_checkpoint(tmp_path, other, other_opt)
    assert_untouched(other, before[0])
    assert_same_optimizer_state(other_opt.state_dict(), before[1])


def test_a_truncated_rank_file_is_refused_and_changes_nothing(tmp_path):
    model, opt = make()
    save_checkpoint(tmp_path, 1, model, opt)
    path = os.path.join(latest_checkpoint(tmp_path), "rank-0.pt")
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 1)
    other, other_opt = make(seed=5)
    step(other, other_opt)
    before = (weights(other), copy.deepcopy(other_opt.state_dict()))
    with pytest.raises(ValueError, match=re.escape(path) + ".*damaged.*bytes"):
        load_checkpoint(tmp_path, other, other_opt)
    assert_untouched(other, before[0])
    assert_same_optimizer_state(other_opt.state_dict(), before[1])


def test_a_checkpoint_without_its_checksums_is_refused(tmp_path):
    save_checkpoint(tmp_path, 1, *make())
    os.remove(os.path.join(latest_checkpoint(tmp_path), "checksums.json"))
    with pytest.raises(ValueError, match="checksums.json"):
        load_checkpoint(tmp_path, *make())


def assert_same_optimizer_state(got, want):
    assert got["param_groups"] == want["param_groups"]
    assert sorted(got["state"]) == sorted(want["state"])
    for i, entry in want["state"].items():
        for k, v in entry.items():
            torch.testing.assert_close(got["state"][i][k], v, rtol=0, atol=0)


# ---- at another world size: saved by 2 or 3 ranks, resumed by 1, 2 and 3 ----------------------
# The global batch (G items) is fixed and re-split over the ranks; each rank's loss is scaled so
# that the averaged gradient is the global batch's mean at any world size. So a run resumed at
# another world size computes the same steps, summed in another order: equal to the
# uninterrupted run within float32 rounding, not bit for bit; at the same world size, bit for bit.
G, SAVE_AT, STEPS = 6, 3, 8
# FSDP: each rank holds its pieces of the weights and of the optimizer state (the momentum,
# Adam's moments); plain SGD without momentum has no state. zero last: its optimizer is the
# consolidate idiom's.
KINDS = ("plain", "fsdp", "fsdp momentum", "fsdp adam", "zero")
ROUNDING = 1e-6  # measured: 6e-8 after 8 steps (float32, weights ~0.1-1); 0 at world size 2
RESUMES = {1: (2,), 2: (2, 3), 3: (2,)}  # resumed at world size: the world sizes it saved at


def data():
    g = torch.Generator().manual_seed(7)
    return torch.randn(STEPS * G, 5, generator=g), torch.randn(STEPS * G, 2, generator=g)


def build(kind):
    from dist_sgd.shard.fsdp import FullyShardedDataParallel
    from dist_sgd.shard.zero import ShardedOptimizer
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 2))
    if kind.startswith("fsdp"):  # its full state_dict, and the full optimizer state
        model = FullyShardedDataParallel(model)
        if kind == "fsdp adam":
            return model, torch.optim.Adam(model.parameters(), lr=0.01)
        return model, SGD(model.parameters(), lr=0.05, momentum=0.9 if "momentum" in kind else 0)
    if kind == "zero":  # torch's keyword for the wrapped optimizer, as ZeroRedundancyOptimizer
        return model, ShardedOptimizer(model.parameters(), optimizer_class=torch.optim.Adam,
                                       lr=0.01)
    return model, SGD(model.parameters(), lr=0.05, momentum=0.9)


def global_step(model, opt, s, rank, world_size, kind):
    from dist_sgd.sgd.sync import average_gradients
    x, y = (t[s * G:(s + 1) * G][rank::world_size] for t in data())  # this rank's share
    opt.zero_grad()
    ((model(x) - y).square().sum() * world_size / G).backward()
    if kind == "plain":  # ShardedOptimizer and FSDP average the gradients themselves
        average_gradients(model)
    opt.step()


def train_and_save(rank, world_size, root):
    """The uninterrupted run, saving a checkpoint at step SAVE_AT on the way."""
    out = {}
    for kind in KINDS:
        model, opt = build(kind)
        for s in range(STEPS):
            global_step(model, opt, s, rank, world_size, kind)
            if s + 1 == SAVE_AT:
                save_checkpoint(os.path.join(root, kind), SAVE_AT, model, opt, items=SAVE_AT * G)
        out[kind] = full_weights(model)
    out["idiom"] = zero_state_dict_idiom(rank, opt)
    return out


def zero_state_dict_idiom(rank, opt):
    """torch's ZeroRedundancyOptimizer idiom: consolidate on every rank, state_dict() on one."""
    found = {}
    if rank == 0:  # not consolidated yet: a clear error at once (not a collective that hangs)
        try:
            opt.state_dict()
        except RuntimeError as e:
            found["unconsolidated"] = str(e)
    opt.consolidate_state_dict(to=0)
    if rank == 0:
        found["keys"] = sorted(opt.state_dict()["state"])
    else:
        try:
            opt.state_dict()
        except RuntimeError as e:
            found["elsewhere"] = str(e)
    return found


def resume(rank, world_size, root):
    out = {}
    for saved_at in RESUMES[world_size]:
        for kind in KINDS:
            model, opt = build(kind)
            try:
                state = load_checkpoint(os.path.join(root, str(saved_at), kind), model, opt)
            except ValueError as e:  # for the test to name: the others go on
                out[saved_at, kind] = out[saved_at, f"{kind} state"] = f"refused: {e}"
                continue
            for s in range(state["step"], STEPS):
                global_step(model, opt, s, rank, world_size, kind)
            out[saved_at, kind] = full_weights(model)
            out[saved_at, f"{kind} state"] = {k: state[k] for k in ("step", "items", "resumed",
                                                                    "rng")}
    if world_size == 2:
        out["damaged rank-1.pt"] = refused(os.path.join(root, "damaged rank-1.pt"), "plain",
                                           rank, world_size)
        out["pieces"] = refused(os.path.join(root, "pieces"), "fsdp momentum", rank, world_size)
        for kind in ("plain", "fsdp adam"):  # a sound checkpoint, but rank 1's optimizer fails
            out["rank 1 fails", kind] = refused(os.path.join(root, "2", kind), kind, rank,
                                                world_size, failing_rank=1)
    return out


def refused(ckpt_dir, kind, rank, world_size, failing_rank=None):
    """Try to load a checkpoint that must be refused into a model and optimizer one step in:
    the error, and their state before and after."""
    model, opt = build(kind)
    global_step(model, opt, 0, rank, world_size, kind)
    before = (full_weights(model), optimizer_state(opt))
    if rank == failing_rank:
        def broken(state_dict):
            raise KeyError("something this optimizer needs")
        opt.load_state_dict = broken
    try:
        load_checkpoint(ckpt_dir, model, opt)
        error = None
    except ValueError as e:
        error = str(e)
    return {"error": error, "before": before, "after": (full_weights(model), optimizer_state(opt))}


def optimizer_state(opt):
    """This rank's optimizer state, as tensors (FSDP: its pieces)."""
    state = opt.state_dict()["state"]
    return {(i, k): torch.as_tensor(v).clone() for i, e in state.items() for k, v in e.items()}


def as_rank_0s_pieces(shared, world_size=3):
    """The optimizer state as a checkpoint of rank 0's own pieces would hold it."""
    for entry in shared["optimizer"]["state"].values():
        for k, v in entry.items():
            if torch.is_tensor(v) and v.dim() >= 2:
                entry[k] = v.reshape(-1)[:-(-v.numel() // world_size)].clone()


@pytest.fixture(scope="module")
def resharded(tmp_path_factory):
    from dist_sgd.plumbing.launch import launch
    root = str(tmp_path_factory.mktemp("resharded"))
    saved = {p: launch(train_and_save, p, os.path.join(root, str(p)), timeout=60) for p in (2, 3)}
    damaged = shutil.copytree(latest_checkpoint(os.path.join(root, "2", "plain")),
                              os.path.join(root, "damaged rank-1.pt", "step-00000003"))
    shutil.copy(os.path.join(root, "2", "plain", "latest"), os.path.dirname(damaged))
    flip_byte(os.path.join(damaged, "rank-1.pt"),
              tensor_data_offset(os.path.join(damaged, "rank-1.pt")))
    pieces = shutil.copytree(os.path.join(root, "3", "fsdp momentum"), os.path.join(root, "pieces"))
    rewrite(latest_checkpoint(pieces), "shared.pt", as_rank_0s_pieces)
    return saved, {n: launch(resume, n, root, timeout=60) for n in RESUMES}


def full_weights(model):
    return [t.clone() for t in model.state_dict().values()]  # FSDP: gathered (collective)


@pytest.mark.parametrize("kind", ["plain", "zero", "fsdp"], ids=["data_parallel", "zero1", "fsdp"])
@pytest.mark.parametrize("world_size", [1, 3])
def test_saved_at_two_ranks_resumes_at_another_world_size_within_rounding(resharded, kind,
                                                                          world_size):
    saved, resumed = resharded
    for rank, r in enumerate(resumed[world_size]):
        assert not isinstance(r[2, kind], str), r[2, kind]
        for got, want in zip(r[2, kind], saved[2][0][kind]):
            torch.testing.assert_close(got, want, rtol=0, atol=ROUNDING,
                                       msg=lambda m: f"rank {rank} of {world_size}: {m}")


@pytest.mark.parametrize("kind", ["fsdp momentum", "fsdp adam"])
@pytest.mark.parametrize("saved_at,world_size", [(2, 2), (3, 2), (2, 3)])
def test_fsdp_checkpoint_holds_the_full_optimizer_state_and_resumes_at_any_world_size(
        resharded, kind, saved_at, world_size):
    # Each rank's own pieces of the momentum (Adam's moments) come back, cut from the whole:
    # at the same world size bit for bit, at another within float32 rounding.
    saved, resumed = resharded
    atol = 0 if saved_at == world_size else ROUNDING
    for rank, r in enumerate(resumed[world_size]):
        assert not isinstance(r[saved_at, kind], str), r[saved_at, kind]
        for got, want in zip(r[saved_at, kind], saved[saved_at][0][kind]):
            torch.testing.assert_close(got, want, rtol=0, atol=atol,
                                       msg=lambda m: f"rank {rank} of {world_size}: {m}")


@pytest.mark.parametrize("world_size", [1, 3])
def test_resuming_at_another_world_size_says_so(resharded, world_size):
    _, resumed = resharded
    for r in resumed[world_size]:
        for kind in KINDS:
            state = r[2, f"{kind} state"]
            assert state["resumed"] == (f"resumed from step {SAVE_AT}, saved at world size 2, "
                                        f"now {world_size}"), state
            assert state["step"] == SAVE_AT and state["items"] == SAVE_AT * G
            assert state["rng"] == "reseeded from (step, rank)"  # no saved rank's stream fits


def test_zero_state_dict_follows_torchs_consolidate_idiom(resharded):
    saved, _ = resharded
    zero, other = saved[2][0]["idiom"], saved[2][1]["idiom"]
    assert "consolidate_state_dict" in zero["unconsolidated"], zero
    assert zero["keys"] == [0, 1, 2, 3], zero  # Adam state of all 4 parameters, plain layout
    assert "consolidate_state_dict" in other["elsewhere"] and "rank 0" in other["elsewhere"]


def assert_refused_and_untouched(r, rank):
    for (got, want) in zip(r["after"], r["before"]):  # the weights, then the optimizer state
        torch.testing.assert_close(got, want, rtol=0, atol=0, msg=lambda m: f"rank {rank}: {m}")


def test_a_damaged_rank_file_is_refused_on_every_rank(resharded):
    # Only rank 1 reads rank-1.pt; rank 0 must refuse too, or it would go on training alone.
    _, resumed = resharded
    for rank, r in enumerate(resumed[2]):
        r = r["damaged rank-1.pt"]
        assert r["error"] and "rank-1.pt" in r["error"] and "damaged" in r["error"], (rank, r)
        assert_refused_and_untouched(r, rank)


def test_one_ranks_pieces_of_the_optimizer_state_are_refused_and_say_so(resharded):
    # A checkpoint holding rank 0's pieces of the momentum, saved at 3 ranks, loaded at 2.
    _, resumed = resharded
    for rank, r in enumerate(resumed[2]):
        r = r["pieces"]
        assert r["error"] and "momentum_buffer" in r["error"], (rank, r)
        assert "piece, as at world size 3" in r["error"] and "(16, 5)" in r["error"], r["error"]
        assert_refused_and_untouched(r, rank)


@pytest.mark.parametrize("kind", ["plain", "fsdp adam"])
def test_a_load_failing_on_one_rank_puts_every_rank_back(resharded, kind):
    # Rank 0 loaded everything before rank 1's optimizer raised: rank 0 goes back too.
    _, resumed = resharded
    for rank, r in enumerate(resumed[2]):
        r = r["rank 1 fails", kind]
        assert r["error"] and "something this optimizer needs" in r["error"], (rank, r)
        assert "left as they were" in r["error"], r["error"]
        assert_refused_and_untouched(r, rank)
