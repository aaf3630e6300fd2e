"""Our DistributedDataParallel against a single process on the full batch and against torch's.

One launch() per world size (2 and 3) runs every check, because a spawn costs seconds here.
The model has every awkward part at once: a frozen layer, a Parameter shared by two layers
(tied weights), a buffer, and a layer that some ranks use in some steps and no rank in others.
Everything is float64, so the tolerances can stay tight.
"""
import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as TorchDDP
from torch.testing import assert_close

from dist_sgd import collectives
from dist_sgd.ddp import DistributedDataParallel, assign_buckets
from dist_sgd.ddp_steps import HookDDP, NaiveDDP
from dist_sgd.launch import launch

PER_RANK = 4
STEPS = 3
CAPS = {"one bucket": None, "per parameter": 0, "tiny": 0.0002, "default": 25.0}


class Toy(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(6, 8)
        self.frozen = nn.Linear(8, 8).requires_grad_(False)
        self.mid = nn.Linear(8, 8)
        self.extra = nn.Linear(8, 8)  # used only when use_extra is true
        self.dec = nn.Linear(8, 8)
        self.dec.weight = self.mid.weight  # tied: one Parameter, two layers
        self.head = nn.Linear(8, 3)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 8))

    def forward(self, x, use_extra=True):
        h = torch.tanh(self.frozen(torch.tanh(self.enc(x)))) * self.scale
        h = torch.tanh(self.mid(h))
        if use_extra:
            h = h + torch.tanh(self.extra(h))
        return self.head(torch.tanh(self.dec(h)))


def make_model(seed):
    torch.manual_seed(seed)
    return Toy().double()


def uses_extra(step, rank):
    # step 0: every rank; step 1: rank 0 only; step 2: nobody (the gradient must stay None)
    return (True, rank == 0, False)[step % 3]


def batch(step, world_size, micro=1):
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(world_size * PER_RANK * micro, 6, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (world_size * PER_RANK * micro,), generator=g)
    return x, y


def shard(t, rank, world_size):
    return t.chunk(world_size)[rank]


def optimizer(model):
    # momentum and weight decay: a None gradient (skipped) and a zero one (not) differ
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)


def reference_run(world_size):
    """One process, the whole global batch: per-step gradients and weights."""
    model = make_model(0)
    opt = optimizer(model)
    grads, weights = [], []
    for step in range(STEPS):
        x, y = batch(step, world_size)
        opt.zero_grad()
        loss = sum(F.cross_entropy(model(shard(x, r, world_size), uses_extra(step, r)),
                                   shard(y, r, world_size)) for r in range(world_size))
        (loss / world_size).backward()  # the mean over equal shards = the full-batch mean
        grads.append({n: None if p.grad is None else p.grad.clone()
                      for n, p in model.named_parameters()})
        opt.step()
        weights.append({n: p.detach().clone() for n, p in model.named_parameters()})
    return grads, weights


def check_run(wrapped, inner, rank, world_size, ref_grads, ref_weights, what, counted=None):
    opt = optimizer(inner)
    for step in range(STEPS):
        x, y = batch(step, world_size)
        opt.zero_grad()
        if counted is not None:
            counted.clear()
        out = wrapped(shard(x, rank, world_size), use_extra=uses_extra(step, rank))
        F.cross_entropy(out, shard(y, rank, world_size)).backward()
        # no explicit synchronization: the gradients must be averaged when backward returns
        for n, p in inner.named_parameters():
            expected = ref_grads[step][n]
            if expected is None:
                assert p.grad is None, f"{what}: step {step}: {n} got a gradient nobody made"
            else:
                assert_close(p.grad, expected, msg=lambda m: f"{what}: step {step}: grad {n}: {m}")
        if counted is not None:
            buffers = sorted(b.flat.data_ptr() for b in wrapped.buckets)
            assert sorted(counted) == buffers, f"{what}: step {step}: one call per bucket expected"
        if hasattr(wrapped, "finish_gradient_synchronization"):
            wrapped.finish_gradient_synchronization()  # idempotent: nothing changes
            wrapped.finish_gradient_synchronization()
        opt.step()
        for n, p in inner.named_parameters():
            assert_close(p, ref_weights[step][n], msg=lambda m: f"{what}: step {step}: {n}: {m}")


def all_checks(rank, world_size):
    ref_grads, ref_weights = reference_run(world_size)
    done = []

    # Construction: ranks start from different weights and end up with rank 0's.
    model = make_model(seed=rank)
    DistributedDataParallel(model)
    for a, b in zip(model.state_dict().values(), make_model(0).state_dict().values()):
        assert_close(a, b)
    done.append("broadcast")

    # Against torch DDP (find_unused_parameters: our model leaves a layer unused).
    model = make_model(seed=rank)
    check_run(TorchDDP(model, find_unused_parameters=True), model, rank, world_size,
              ref_grads, ref_weights, "torch DDP")
    for name, cap in CAPS.items():
        model = make_model(seed=rank)
        ddp = DistributedDataParallel(model, bucket_cap_mb=cap)
        check_run(ddp, model, rank, world_size, ref_grads, ref_weights, f"ours, {name}")
        done.append(f"{name}: {len(ddp.buckets)} buckets")

    # Each bucket (hence each parameter) reduced exactly once per step, through a counting
    # all_reduce; and our hand-written all_reduce in the same role.
    counted = []

    def counting_all_reduce(t):
        counted.append(t.data_ptr())
        dist.all_reduce(t)

    model = make_model(seed=rank)
    ddp = DistributedDataParallel(model, bucket_cap_mb=CAPS["tiny"], all_reduce=counting_all_reduce)
    check_run(ddp, model, rank, world_size, ref_grads, ref_weights, "counted", counted)
    members = [p for b in ddp.buckets for p in b.params]
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert len(members) == len(trainable) == len(set(members))
    model = make_model(seed=rank)
    ddp = DistributedDataParallel(model, bucket_cap_mb=CAPS["tiny"],
                                  all_reduce=collectives.all_reduce)
    check_run(ddp, model, rank, world_size, ref_grads, ref_weights, "ours + our all_reduce")
    done.append("counted + our all_reduce")

    # Steps 1 and 2 of lesson 07 (every rank uses every layer: step 2 cannot handle less).
    for cls in (NaiveDDP, HookDDP):
        model = make_model(seed=rank)
        wrapped = cls(model)
        x, y = batch(0, world_size)
        F.cross_entropy(wrapped(shard(x, rank, world_size)), shard(y, rank, world_size)).backward()
        wrapped.finish_gradient_synchronization()
        for n, p in model.named_parameters():
            assert_close(p.grad, ref_grads[0][n], msg=lambda m: f"{cls.__name__}: {n}: {m}")
    done.append("steps 1-2")

    # no_sync: two local backward passes, then a synced one == one batch three times larger.
    # The extra layer is used in the first (local) pass only: the synced pass must still send
    # its accumulated gradient, not zeros.
    model = make_model(seed=rank)
    ddp = DistributedDataParallel(model, bucket_cap_mb=CAPS["tiny"])
    x, y = batch(7, world_size, micro=3)
    xs, ys = shard(x, rank, world_size).chunk(3), shard(y, rank, world_size).chunk(3)
    for i in range(3):
        if i < 2:
            with ddp.no_sync():
                (F.cross_entropy(ddp(xs[i], use_extra=i == 0), ys[i]) / 3).backward()
            assert ddp.buckets[0].future is None, "no_sync must not launch any all-reduce"
        else:
            (F.cross_entropy(ddp(xs[i], use_extra=False), ys[i]) / 3).backward()
    big = make_model(0)
    for i in range(3):  # micro-batch i of the global batch: every rank's i-th chunk
        xi = torch.cat([shard(x, r, world_size).chunk(3)[i] for r in range(world_size)])
        yi = torch.cat([shard(y, r, world_size).chunk(3)[i] for r in range(world_size)])
        (F.cross_entropy(big(xi, use_extra=i == 0), yi) / 3).backward()
    for (n, p), q in zip(model.named_parameters(), big.parameters()):
        assert_close(p.grad, q.grad, msg=lambda m: f"no_sync: {n}: {m}")
    done.append("no_sync")

    # Overlap: with several buckets, the first all-reduce starts before backward's last hook.
    model = make_model(seed=rank)
    ddp = DistributedDataParallel(model, bucket_cap_mb=0)
    ddp.trace = []
    x, y = batch(0, world_size)
    F.cross_entropy(ddp(shard(x, rank, world_size)), shard(y, rank, world_size)).backward()
    events = [e["event"] for e in ddp.trace]
    assert events.index("launch") < len(events) - 1 - events[::-1].index("hook"), events
    assert events.count("done") == len(ddp.buckets) and events[-1] == "synchronized", events
    done.append("overlap")
    return done


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_ddp_matches_single_process_and_torch(world_size):
    results = launch(all_checks, world_size, backend="gloo")
    assert len(results) == world_size
    assert all(r == results[0] for r in results), results
    assert "no_sync" in results[0] and "overlap" in results[0]


def test_bucket_assignment():
    params = [(f"p{i}", nn.Parameter(torch.zeros(n))) for i, n in enumerate([10, 300, 5, 1000])]
    names = lambda groups: [[n for n, _ in g] for g in groups]  # noqa: E731
    assert names(assign_buckets(params, None)) == [["p3", "p2", "p1", "p0"]]
    assert names(assign_buckets(params, 0)) == [["p3"], ["p2"], ["p1"], ["p0"]]
    # 1,300-byte cap: p3 (4,000 bytes) closes a bucket alone; p2 + p1 + p0 (1,260) stay open
    assert names(assign_buckets(params, 1300 / 2 ** 20)) == [["p3"], ["p2", "p1", "p0"]]
    with pytest.raises(ValueError, match="bucket_cap_mb"):
        assign_buckets(params, -1)


def test_needs_a_process_group():
    with pytest.raises(RuntimeError, match="process group"):
        DistributedDataParallel(nn.Linear(2, 2))
