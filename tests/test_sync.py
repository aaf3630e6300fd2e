"""Gradient equivalence: the distributed average equals the single-process full-batch gradient.

One launch() per world size (a spawn costs seconds); every check runs inside it, with
torch.testing.assert_close raising on the rank that sees a difference (the launcher then
reports which rank and why). float64 throughout, so "equal" can mean ~1e-15.
"""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import TensorDataset
from torch.utils.data.distributed import DistributedSampler

from dist_sgd.sgd.data import synthetic
from dist_sgd.plumbing.launch import launch
from dist_sgd.sgd.models import MLP
from dist_sgd.sgd.optim import SGD
from dist_sgd.sgd.partition import ShardSampler
from dist_sgd.sgd.sync import average_gradients, broadcast_parameters, gradients_to_sync
from dist_sgd.sgd.train import evaluate, max_diff_across_ranks, per_rank_batch, shard_loader

PER_RANK = 4  # items per rank per step


class Awkward(nn.Module):
    """A frozen weight, a layer that never gets a gradient, a weight shared by two layers,
    and a buffer: every case average_gradients must skip or count once."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(784, 12)
        self.frozen = nn.Linear(12, 12)
        self.frozen.weight.requires_grad_(False)  # its bias still trains
        self.a = nn.Linear(12, 12)
        self.b = nn.Linear(12, 12)
        self.b.weight = self.a.weight  # tied: one Parameter, two modules
        self.unused = nn.Linear(12, 10)  # never called in forward: .grad stays None
        self.head = nn.Linear(12, 10)
        self.register_buffer("running", torch.zeros(12))

    def forward(self, x):
        h = torch.tanh(self.inp(x.flatten(1)))
        h = torch.tanh(self.b(torch.tanh(self.a(self.frozen(h)))))
        return F.log_softmax(self.head(h), dim=1)


def grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def check_gradients(rank, world_size, flat, all_reduce, x, y):
    """(1) the first-step gradient, (2) weights after 3 SGD steps, (3) ranks identical."""
    torch.manual_seed(0)  # the same initial weights on every rank
    ref = Awkward().double()
    model = copy.deepcopy(ref)
    steps, b = 3, PER_RANK
    opt_ref = SGD(ref.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    opt = SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    worst = 0.0
    for step in range(steps):
        xs, ys = x[step], y[step]  # this step's global batch
        opt_ref.zero_grad()
        F.nll_loss(ref(xs), ys).backward()  # single process: mean over the global batch
        opt.zero_grad()
        mine = slice(rank * b, (rank + 1) * b)
        F.nll_loss(model(xs[mine]), ys[mine]).backward()  # mean over the local batch
        calls = average_gradients(model, flat=flat, all_reduce=all_reduce)
        assert calls == (1 if flat else 8), calls  # 11 parameters: 1 frozen, 2 without grad
        assert model.frozen.weight.grad is None and model.unused.weight.grad is None
        want, got = grads(ref), grads(model)
        assert want.keys() == got.keys()
        for name in want:
            torch.testing.assert_close(got[name], want[name], msg=f"step {step} grad {name}")
            worst = max(worst, (got[name] - want[name]).abs().max().item())
        opt_ref.step()
        opt.step()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, msg=f"weight {name} after {steps} steps")
    assert max_diff_across_ranks(model) == 0.0, "ranks hold different weights"
    return worst


def check_accumulation(rank, world_size, x, y, k=2):
    """k micro-batches per rank, loss / k each, one average: the same as one big batch."""
    torch.manual_seed(1)
    ref, model = MLP(hidden=8).double(), MLP(hidden=8).double()
    model.load_state_dict(ref.state_dict())
    xs, ys = x.reshape(-1, *x.shape[2:]), y.reshape(-1)  # k * global batch items
    big = k * world_size * PER_RANK
    xs, ys = xs[:big], ys[:big]
    F.nll_loss(ref(xs), ys).backward()
    local = slice(rank * k * PER_RANK, (rank + 1) * k * PER_RANK)
    for xm, ym in zip(xs[local].chunk(k), ys[local].chunk(k)):
        (F.nll_loss(model(xm), ym) / k).backward()  # .grad accumulates across backward calls
    average_gradients(model)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


def check_train_loop(rank, world_size):
    """shard_loader's per-rank batches + average_gradients == single-process SGD on the same
    global batches."""
    data = synthetic(48, seed=3)
    images, labels = data.tensors
    dataset = TensorDataset(images.double(), labels)
    global_batch = 2 * world_size * 3  # divides for both world sizes: per rank 6
    torch.manual_seed(2)
    model = MLP(hidden=8).double()
    ref = copy.deepcopy(model)
    loader = shard_loader(dataset, global_batch, seed=5)
    loader.sampler.set_epoch(1)
    opt = SGD(model.parameters(), lr=0.2, momentum=0.5)
    seen = 0
    for xb, yb in loader:  # lesson 06's step
        seen += len(yb)
        opt.zero_grad()
        F.nll_loss(model(xb), yb).backward()
        average_gradients(model)
        opt.step()
    order = ShardSampler(dataset, 1, 0, seed=5)  # the single process sees the same order
    order.set_epoch(1)
    opt = SGD(ref.parameters(), lr=0.2, momentum=0.5)
    indices = list(order)
    for start in range(0, len(indices), global_batch):
        xb, yb = dataset[torch.tensor(indices[start:start + global_batch])]
        opt.zero_grad()
        F.nll_loss(ref(xb), yb).backward()
        opt.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q)
    assert seen * world_size == 48  # every item once over the ranks, no padding
    # evaluate shares the test set out without padding: the same numbers as one process
    result = evaluate(model, dataset, batch_size=7)
    with torch.no_grad():
        out = model(dataset.tensors[0])
    torch.testing.assert_close(result["loss"], F.nll_loss(out, labels, reduction="mean").item())
    assert result["correct"] == (out.argmax(1) == labels).sum().item() and result["total"] == 48


def rank_checks(rank, world_size):
    from dist_sgd.comm import collectives  # the hand-written all_reduce (helper "collectives")

    data = synthetic(3 * world_size * PER_RANK * 2, seed=1)
    images, labels = data.tensors
    x = images.double().reshape(3 * 2, world_size * PER_RANK, 1, 28, 28)
    y = labels.reshape(3 * 2, world_size * PER_RANK)
    worst = {}
    for name, all_reduce in (("torch", None), ("ours", collectives.all_reduce)):
        for flat in (False, True):
            worst[(name, flat)] = check_gradients(rank, world_size, flat, all_reduce, x[:3], y[:3])

    # A list with the tied weight twice still reduces it once (else it would be halved again).
    model = Awkward().double()
    F.nll_loss(model(x[0, :PER_RANK]), y[0, :PER_RANK]).backward()
    assert len(gradients_to_sync(list(model.parameters()) + [model.a.weight])) == 8

    check_accumulation(rank, world_size, x, y)
    check_train_loop(rank, world_size)

    # broadcast_parameters: ranks start different, end equal to rank 0 (buffers too).
    for broadcast in (None, collectives.broadcast):
        torch.manual_seed(100 + rank)
        model = Awkward()
        model.running.fill_(rank + 1.0)
        before = max_diff_across_ranks(model)
        assert broadcast_parameters(model, src=0, broadcast=broadcast) == 12  # 11 params + 1 buffer
        assert (before > 0) == (world_size > 1)  # one rank: nothing differs to begin with
        assert max_diff_across_ranks(model) == 0.0
        assert model.running.eq(1.0).all()

    # ShardSampler takes world size and rank from the group, like DistributedSampler.
    sampler, theirs = ShardSampler(data), DistributedSampler(data)
    assert (sampler.num_replicas, sampler.rank) == (world_size, rank)
    assert list(sampler) == list(theirs)
    return worst


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_distributed_gradients_equal_single_process(world_size):
    results = launch(rank_checks, world_size)
    assert len(results) == world_size
    for worst in results:
        assert set(worst) == {(n, f) for n in ("torch", "ours") for f in (False, True)}
        assert all(v < 1e-12 for v in worst.values()), worst


def test_errors_outside_a_group_and_bad_batches():
    model = MLP()
    with pytest.raises(RuntimeError, match="needs a process group"):
        average_gradients(model)
    with pytest.raises(ValueError, match="does not divide evenly over 3 ranks"):
        per_rank_batch(64, 3)
    with pytest.raises(ValueError, match="positive integer"):
        per_rank_batch(64.0, 2)
    assert per_rank_batch(64, 4) == 16
