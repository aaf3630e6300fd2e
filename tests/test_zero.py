"""ShardedOptimizer (ZeRO-1) against the plain optimizer and torch's ZeroRedundancyOptimizer.

One launch per world size (2 and 3) runs every configuration; each rank returns its
parameters after every step, its shard and its state, and the small tests below compare them
with torch.testing.assert_close. float64 throughout: "equal" means rounding only.

Every configuration: a model with odd sizes, a frozen weight, two parameter groups with their
own options, a StepLR scheduler, and a layer added with add_param_group before the third step.
Reference: the plain optimizer after average_gradients (plain data parallelism).
"""
import copy
import itertools

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.optim import ZeroRedundancyOptimizer

from dist_sgd.comm import collectives
from dist_sgd.comm.counted import wire_bytes
from dist_sgd.ddp.ddp import DistributedDataParallel
from dist_sgd.plumbing.launch import launch
from dist_sgd.sgd.optim import SGD
from dist_sgd.sgd.sync import average_gradients
from dist_sgd.shard.zero import ShardedOptimizer, partition

STEPS, ADD_AT, MORE_STEPS = 4, 2, 2
OPTIMIZERS = {
    "torch SGD momentum": (torch.optim.SGD, {"lr": 0.05, "momentum": 0.9, "weight_decay": 1e-3}),
    "our SGD momentum": (SGD, {"lr": 0.05, "momentum": 0.9, "nesterov": True}),
    "Adam": (torch.optim.Adam, {"lr": 0.01}),
    "AdamW": (torch.optim.AdamW, {"lr": 0.01, "weight_decay": 0.05}),
}
SCHEMES = ("broadcast", "all_gather")
COLLECTIVES = ("torch", "ours")
# Who averages the gradients: the optimizer itself, average_gradients before step(), our DDP.
GRADIENTS = ("optimizer", "average_gradients", "our DDP")
ZERO_TORCH = ("Adam", "torch SGD momentum")  # compared with torch's ZeroRedundancyOptimizer
# Every optimizer in both schemes; every way of communicating with Adam (and one with our SGD):
# one spawned group runs them all, so the list stays short enough for the suite's budget.
CONFIGS = ([(name, scheme, "torch", "optimizer") for name in OPTIMIZERS for scheme in SCHEMES]
           + [("Adam", *c) for c in itertools.product(SCHEMES, COLLECTIVES, GRADIENTS)
              if c[1:] != ("torch", "optimizer")]
           + [("our SGD momentum", "all_gather", "ours", "our DDP")])


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(7, 5)
        self.frozen = nn.Linear(5, 5)
        self.frozen.weight.requires_grad_(False)  # its bias still trains
        self.b = nn.Linear(5, 3)
        self.late = nn.Linear(3, 3)  # joins the optimizer later, with add_param_group

    def forward(self, x):
        return self.late(torch.tanh(self.b(torch.tanh(self.frozen(torch.tanh(self.a(x)))))))


def groups(model, with_late=False):
    out = [{"params": list(model.a.parameters())},
           {"params": [model.frozen.weight, model.frozen.bias, *model.b.parameters()], "lr": 0.02}]
    return out + ([late_group(model)] if with_late else [])


def late_group(model):
    return {"params": list(model.late.parameters()), "lr": 0.03}


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)  # every rank its own data
    return torch.randn(4, 7, generator=g, dtype=torch.float64), torch.randn(4, 3, generator=g,
                                                                            dtype=torch.float64)


def train_step(model, opt, rank, step, forward=None, before_step=None):
    model.zero_grad(set_to_none=True)  # the late layer is in no optimizer at first
    x, y = batch(rank, step)
    F.mse_loss((forward or model)(x), y).backward()
    if before_step:
        before_step()
    opt.step()


def params(model):
    return [p.detach().clone() for p in model.parameters()]


def run_config(rank, world_size, name, scheme, colls, gradients):
    cls, kwargs = OPTIMIZERS[name]
    torch.manual_seed(0)
    ref = Small().double()
    model = copy.deepcopy(ref)
    ref_opt = cls(groups(ref), **kwargs)
    opt = ShardedOptimizer(groups(model), cls, scheme=scheme, collectives=colls,
                           reduce_gradients=(gradients == "optimizer"), **kwargs)
    scheds = [torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5) for o in (ref_opt, opt)]
    forward, before = model, None
    if gradients == "average_gradients":
        reduce = collectives.all_reduce if colls == "ours" else None
        before = lambda: average_gradients(model, all_reduce=reduce)  # noqa: E731
    elif gradients == "our DDP":
        forward = DistributedDataParallel(model)
    out = {"got": [], "want": [], "comm": []}
    for step in range(STEPS):
        if step == ADD_AT:
            ref_opt.add_param_group(late_group(ref))
            opt.add_param_group(late_group(model))
        train_step(ref, ref_opt, rank, step, before_step=lambda: average_gradients(ref))
        train_step(model, opt, rank, step, forward=forward, before_step=before)
        for s in scheds:
            s.step()
        out["got"].append(params(model))
        out["want"].append(params(ref))
        out["comm"].append(list(opt.comm_log))
    if gradients == "our DDP":
        forward.remove_hooks()
    index = opt._global_index()
    out["shard"] = sorted(index[id(p)] for p in opt.shard())
    out["state"] = {index[id(p)]: {k: tuple(v.shape) for k, v in s.items() if torch.is_tensor(v)}
                    for p, s in opt.optim.state.items()}
    out["shapes"] = {index[id(p)]: tuple(p.shape) for g in opt.param_groups for p in g["params"]}
    out["trainable"] = sorted(index[id(p)] for p in model.parameters() if p.requires_grad)
    out["lr"] = [g["lr"] for g in opt.param_groups], [g["lr"] for g in ref_opt.param_groups]
    if colls == "torch" and gradients == "optimizer":
        out.update(round_trip(rank, cls, kwargs, model, opt, ref, ref_opt, scheme))
    return out


def round_trip(rank, cls, kwargs, model, opt, ref, ref_opt, scheme):
    """Our state_dict equals the plain one; loaded into the plain optimizer, whose state_dict
    loaded back into a fresh ShardedOptimizer, both train on exactly like the reference."""
    for r in range(dist.get_world_size()):  # torch's idiom, once towards every rank
        opt.consolidate_state_dict(to=r)
        if r == rank:
            saved = opt.state_dict()
    plain_model = copy.deepcopy(model)
    plain = cls(groups(plain_model, with_late=True), **kwargs)
    plain.load_state_dict(copy.deepcopy(saved))
    back_model = copy.deepcopy(model)
    back = ShardedOptimizer(groups(back_model, with_late=True), cls, scheme=scheme, **kwargs)
    back.load_state_dict(copy.deepcopy(plain.state_dict()))
    out = {"saved": saved, "plain_saved": copy.deepcopy(ref_opt.state_dict()), "after_load": []}
    for step in range(STEPS, STEPS + MORE_STEPS):
        train_step(ref, ref_opt, rank, step, before_step=lambda: average_gradients(ref))
        train_step(plain_model, plain, rank, step, before_step=lambda: average_gradients(plain_model))
        train_step(back_model, back, rank, step)
        out["after_load"].append((params(ref), params(plain_model), params(back_model)))
    return out


def against_torch_zero(rank, cls, kwargs):
    """torch's ZeroRedundancyOptimizer and ours in both schemes, on the same gradients."""
    torch.manual_seed(0)
    models = [Small().double() for _ in range(3)]
    for m in models[1:]:
        m.load_state_dict(models[0].state_dict())
    opts = [ZeroRedundancyOptimizer(groups(models[0]), cls, **kwargs)]
    opts += [ShardedOptimizer(groups(m), cls, scheme=s, reduce_gradients=False, **kwargs)
             for m, s in zip(models[1:], SCHEMES)]
    history = []
    for step in range(STEPS):
        for m, o in zip(models, opts):
            if step == ADD_AT:
                o.add_param_group(late_group(m))
            train_step(m, o, rank, step, before_step=lambda m=m: average_gradients(m))
        history.append([params(m) for m in models])
    return history


def worker(rank, world_size):
    results = {config: run_config(rank, world_size, *config) for config in CONFIGS}
    for name in ZERO_TORCH:
        results[name] = against_torch_zero(rank, *OPTIMIZERS[name])
    dist.barrier()  # our DDP's reducers: let every rank finish before the group goes
    return results


@pytest.fixture(scope="module", params=[2, 3], ids=lambda p: f"p{p}")
def runs(request):
    return request.param, launch(worker, request.param, backend="gloo")


# ---- the tests ------------------------------------------------------------------------------

@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(c).replace(" ", "_"))
def test_parameters_equal_the_plain_optimizer_after_every_step(runs, config):
    _, results = runs
    for r in results:
        for step, (got, want) in enumerate(zip(r[config]["got"], r[config]["want"])):
            torch.testing.assert_close(got, want, msg=lambda m, s=step: f"step {s}: {m}")


def test_lr_schedulers_drive_the_sharded_optimizer(runs):
    _, results = runs
    for r in results:
        for config in CONFIGS:
            got, want = r[config]["lr"]
            assert got == want and got[0] < OPTIMIZERS[config[0]][1]["lr"], (config, got, want)


@pytest.mark.parametrize("name", ZERO_TORCH)
def test_equal_to_torch_zero_redundancy_optimizer(runs, name):
    _, results = runs
    for r in results:
        for step in r[name]:
            torch_zero, *ours = step
            for mine in ours:
                torch.testing.assert_close(mine, torch_zero)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(c).replace(" ", "_"))
def test_each_rank_holds_state_only_for_its_shard_and_shards_cover_all_once(runs, config):
    world_size, results = runs
    shards = [r[config]["shard"] for r in results]
    everyone = sorted(i for s in shards for i in s)
    assert everyone == results[0][config]["trainable"], "shards must cover each trainable once"
    assert all(shards), f"every rank owns something here: {shards}"
    for r in results:
        state = r[config]["state"]
        assert set(state) <= set(r[config]["shard"]), "state for a parameter another rank owns"
        for i, tensors in state.items():  # every state tensor has its parameter's size
            for key, shape in tensors.items():
                assert shape in (r[config]["shapes"][i], ()), (key, shape)
    if config[0] in ("Adam", "AdamW"):  # Adam keeps state for every parameter it updated
        owned = sorted(i for r in results for i in r[config]["state"])
        assert owned == everyone


@pytest.mark.parametrize("name", list(OPTIMIZERS))
@pytest.mark.parametrize("scheme", SCHEMES)
def test_state_dict_round_trip_through_the_plain_optimizer(runs, name, scheme):
    _, results = runs
    config = (name, scheme, "torch", "optimizer")
    for r in results:
        saved, want = r[config]["saved"], r[config]["plain_saved"]
        assert saved["param_groups"] == want["param_groups"]
        assert sorted(saved["state"]) == sorted(want["state"])
        for i in want["state"]:
            torch.testing.assert_close(saved["state"][i], want["state"][i], check_device=False)
        for ref, plain, back in r[config]["after_load"]:
            torch.testing.assert_close(plain, ref)
            torch.testing.assert_close(back, ref)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_bytes_counted_per_step(runs, scheme):
    """broadcast: an all-reduce (unless DDP did it) + (p-1)/p N; all_gather: the padded
    reduce-scatter + all-gather. Under DDP / average_gradients no gradient collective."""
    p, results = runs
    for config in CONFIGS:
        if config[1] != scheme:
            continue
        log = results[0][config]["comm"][-1]
        kinds = [c for c, _ in log]
        grad = {"broadcast": "all_reduce", "all_gather": "reduce_scatter"}[scheme]
        assert (grad in kinds) == (config[3] == "optimizer"), (config, kinds)
        if scheme == "broadcast":
            assert kinds.count("broadcast") == 7  # one per trainable parameter (late included)
        else:
            assert kinds.count("all_gather") == 1
    log = results[0][("Adam", scheme, "torch", "optimizer")]["comm"][-1]
    n_bytes = sum(t.numel() * 8 for t in results[0][("Adam", scheme, "torch", "optimizer")]["got"][-1]) \
        - 5 * 5 * 8  # every parameter's gradient but the frozen weight's (float64)
    sent = sum(wire_bytes(c, n, p) for c, n in log)
    plain = wire_bytes("all_reduce", n_bytes, p)
    if scheme == "broadcast":
        assert sent == pytest.approx(1.5 * plain)
    else:
        assert 1.0 * plain <= sent < 1.5 * plain  # 1.0x plus the padding of unequal shards


def test_partition_is_balanced_and_deterministic():
    owners, loads = partition([[10, 3, None, 7, 7], [5]], 3)
    assert owners == [[0, 1, None, 1, 2], [2]]  # largest first, to the least loaded
    assert loads == [10, 10, 12]
    more, loads2 = partition([[1]], 3, loads)  # a group added later: earlier owners stay
    assert more == [[0]] and loads2 == [11, 10, 12]


def test_bad_arguments_get_clear_errors():
    with pytest.raises(ValueError, match="scheme"):
        ShardedOptimizer([nn.Parameter(torch.ones(1))], torch.optim.SGD, scheme="ring", lr=0.1)
    with pytest.raises(ValueError, match="collectives"):
        ShardedOptimizer([nn.Parameter(torch.ones(1))], torch.optim.SGD, collectives="mpi", lr=0.1)
    with pytest.raises(RuntimeError, match="process group"):
        ShardedOptimizer([nn.Parameter(torch.ones(1))], torch.optim.SGD, lr=0.1)
