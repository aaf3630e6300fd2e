"""Local SGD against torch: H = 1 == synchronous SGD; H > 1 == torch's PeriodicModelAverager,
step for step; DiLoCo with outer lr 1 and no momentum == plain averaging, and its Nesterov
outer step == the formula. One launch of 3 ranks (an odd world size) runs every scenario.
"""
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager

from dist_sgd.sgd.data import synthetic
from dist_sgd.plumbing.launch import launch
from dist_sgd.beyond.local_sgd import LocalSGD
from dist_sgd.sgd.models import MLP
from dist_sgd.beyond.ps import flat_weights

STEPS, PER_RANK, LR, MOMENTUM, WD = 9, 4, 0.1, 0.9, 1e-3


def fresh():
    torch.manual_seed(0)
    return MLP(hidden=6).double()


def local_batches(rank, world_size):
    data = synthetic(n=STEPS * PER_RANK * world_size, seed=5)
    x = data.images.double().view(STEPS, world_size, PER_RANK, 1, 28, 28)[:, rank]
    return x, data.labels.view(STEPS, world_size, PER_RANK)[:, rank]


def train(rank, world_size, after_step, sync_gradients=False):
    """STEPS steps of SGD on this rank's batches; after_step(model) after each optimizer step.
    Returns the flat weights after every step."""
    model = fresh()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WD)
    x, y = local_batches(rank, world_size)
    hook = after_step(model)
    history = []
    for step in range(STEPS):
        opt.zero_grad()
        F.nll_loss(model(x[step]), y[step]).backward()
        if sync_gradients:  # synchronous SGD: average the gradients before the step
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world_size
        opt.step()
        hook()
        history.append(flat_weights(model).clone())
    return history


def ours(**kw):
    def make(model):
        return LocalSGD(model.parameters(), **kw).step
    return make


def torchs(period, warmup_steps=0):
    def make(model):
        averager = PeriodicModelAverager(period=period, warmup_steps=warmup_steps)
        return lambda: averager.average_parameters(model.parameters())
    return make


def groups(model):
    """Two parameter groups, as opt.param_groups holds them (torch's averager takes these)."""
    params = list(model.parameters())
    return [{"params": params[:2], "lr": LR}, {"params": params[2:], "lr": LR / 2}]


def ours_groups(period):
    def make(model):
        return LocalSGD(groups(model), period=period).step
    return make


def torchs_groups(period):
    def make(model):
        averager = PeriodicModelAverager(period=period)
        return lambda: averager.average_parameters(groups(model))
    return make


def nothing(model):
    return lambda: None


def diloco_by_hand(rank, world_size, period, outer_lr, mu):
    """DiLoCo written out: anchor -= outer_lr * (g + mu * b) (Nesterov), g = anchor - mean."""
    state = {}

    def make(model):
        state["anchor"] = flat_weights(model).clone()
        state["counter"], state["b"] = 0, None

        def hook():
            if state["counter"] % period == 0:
                w = flat_weights(model).clone()
                dist.all_reduce(w)
                g = state["anchor"] - w / world_size
                state["b"] = g.clone() if state["b"] is None else mu * state["b"] + g
                state["anchor"] = state["anchor"] - outer_lr * (g + mu * state["b"])
                with torch.no_grad():
                    torch.nn.utils.vector_to_parameters(state["anchor"].clone(), model.parameters())
            state["counter"] += 1
        return hook
    return make


def scenarios(rank, world_size):
    out = {
        "sync": train(rank, world_size, nothing, sync_gradients=True),
        "H=1": train(rank, world_size, ours(period=1)),
        "H=4": train(rank, world_size, ours(period=4)),
        "torch H=4": train(rank, world_size, torchs(4)),
        "H=4 param groups": train(rank, world_size, ours_groups(4)),
        "torch H=4 param groups": train(rank, world_size, torchs_groups(4)),
        "H=2 warmup 3": train(rank, world_size, ours(period=2, warmup_steps=3)),
        "torch H=2 warmup 3": train(rank, world_size, torchs(2, 3)),
        "diloco plain": train(rank, world_size, ours(period=3, outer_lr=1.0)),
        "torch H=3": train(rank, world_size, torchs(3)),
        "diloco": train(rank, world_size, ours(period=3, outer_lr=0.7, outer_momentum=0.9,
                                              nesterov=True)),
        "diloco by hand": train(rank, world_size, diloco_by_hand(rank, world_size, 3, 0.7, 0.9)),
    }
    dist.barrier()
    return out


@pytest.fixture(scope="module")
def three():
    return launch(scenarios, 3, backend="gloo", timeout=60)


@pytest.mark.parametrize("ours_key,ref_key", [
    ("H=1", "sync"),                         # local SGD with H = 1 is synchronous SGD
    ("H=4", "torch H=4"),                    # == PeriodicModelAverager, step for step
    ("H=4 param groups", "torch H=4 param groups"),  # given opt.param_groups, as torch's takes
    ("H=2 warmup 3", "torch H=2 warmup 3"),
    ("diloco plain", "torch H=3"),           # outer lr 1, no momentum: plain averaging
    ("diloco", "diloco by hand"),            # the outer Nesterov step
])
def test_local_sgd_matches_reference_step_for_step(three, ours_key, ref_key):
    for rank in range(3):
        for step in range(STEPS):
            torch.testing.assert_close(three[rank][ours_key][step], three[rank][ref_key][step],
                                       msg=f"{ours_key} vs {ref_key}: rank {rank} step {step}")


def test_copies_drift_between_averages_and_meet_at_them(three):
    # H = 4 averages after steps 0, 4, 8 (torch's schedule): equal there, apart in between.
    for step in range(STEPS):
        spread = max((three[r]["H=4"][step] - three[0]["H=4"][step]).abs().max().item()
                     for r in (1, 2))
        if step % 4 == 0:
            assert spread < 1e-12, (step, spread)
        else:
            assert spread > 1e-6, (step, spread)


def test_diloco_outer_step_is_not_plain_averaging(three):
    diff = (three[0]["diloco"][-1] - three[0]["torch H=3"][-1]).abs().max().item()
    assert diff > 1e-4, diff


def test_single_process_and_bad_arguments():
    model = fresh()
    before = flat_weights(model).clone()
    local = LocalSGD(model.parameters(), period=2)
    assert local.step() and not local.step() and local.syncs == 1 and local.bytes_per_sync == 0
    torch.testing.assert_close(flat_weights(model), before)  # one process: its own average
    opt = torch.optim.SGD([{"params": [model.fc1.weight]}, {"params": [model.fc2.weight]}], lr=1)
    assert LocalSGD(opt.param_groups, period=2).params == [model.fc1.weight, model.fc2.weight]
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="period"):
            LocalSGD(model.parameters(), period=bad)
