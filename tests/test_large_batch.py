"""Lesson 18's pieces against torch's or against their definitions: the warmup-then-decay
schedule (torch's LinearLR + SequentialLR + MultiStepLR / CosineAnnealingLR), LARS (a float64
transcription of the paper's Algorithm 1; torch's SGD where it must agree), the two-batch
noise-scale estimator (unbiased on gradients of known covariance), the steps fit, and
SyncBatchNorm (BatchNorm on the global batch in one process, world sizes 1-4, uneven batches).
"""
import copy
import math

import pytest
import torch
import torch.nn as nn
from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, MultiStepLR, SequentialLR

from dist_sgd.large_batch.curve import accuracy_table, fit_steps, flat_range
from dist_sgd.large_batch.lars import LARS
from dist_sgd.large_batch.noise import NoiseScale, two_batch_estimates
from dist_sgd.large_batch.schedule import WarmupDecayLR, lr_at
from dist_sgd.plumbing.launch import launch

# ---- the schedule ------------------------------------------------------------------------

SCHEDULES = [  # (warmup_steps, start_factor, decay, milestones, gamma, total, eta_min, steps)
    (5, 1 / 8, "step", (3, 7), 0.1, None, 0.0, 20),
    (1, 0.25, "step", (0, 2), 0.5, None, 0.0, 8),  # a one-step warmup; a milestone at 0
    (7, 1 / 3, "cosine", (), 0.1, 30, 0.0, 40),  # on past T_max: torch's cosine rises again
    (4, 0.5, "cosine", (), 0.1, 9, 0.001, 9),  # eta_min
    (3, 1.0, "step", (5,), 0.3, None, 0.0, 12),  # start_factor 1: no warmup in effect
]


def _torch_chain(opt, warmup, start_factor, decay, milestones, gamma, total, eta_min):
    after = (MultiStepLR(opt, list(milestones), gamma) if decay == "step" else
             CosineAnnealingLR(opt, T_max=total - warmup, eta_min=eta_min))
    return SequentialLR(opt, [LinearLR(opt, start_factor, 1.0, total_iters=warmup), after],
                        milestones=[warmup])


def _two_groups():
    w = [nn.Parameter(torch.zeros(2)), nn.Parameter(torch.zeros(3))]
    return torch.optim.SGD([{"params": [w[0]]}, {"params": [w[1]], "lr": 0.8}], lr=0.3,
                           momentum=0.9)


@pytest.mark.parametrize("setting", SCHEDULES, ids=lambda s: f"{s[2]}-warmup{s[0]}")
def test_schedule_equals_torchs_chain_at_every_step(setting):
    warmup, start, decay, milestones, gamma, total, eta_min, steps = setting
    theirs_opt, ours_opt = _two_groups(), _two_groups()
    theirs = _torch_chain(theirs_opt, warmup, start, decay, milestones, gamma, total, eta_min)
    ours = WarmupDecayLR(ours_opt, warmup, start, decay, milestones, gamma, total, eta_min)
    kw = dict(warmup_steps=warmup, start_factor=start, decay=decay, milestones=milestones,
              gamma=gamma, total_steps=total, eta_min=eta_min)
    for step in range(steps):
        expected = [g["lr"] for g in theirs_opt.param_groups]
        got = [g["lr"] for g in ours_opt.param_groups]
        assert got == pytest.approx(expected, rel=1e-12, abs=1e-15), f"step {step}"
        assert ours.get_last_lr() == pytest.approx(theirs.get_last_lr(), rel=1e-12, abs=1e-15)
        assert [lr_at(step, peak, **kw) for peak in (0.3, 0.8)] == \
            pytest.approx(expected, rel=1e-12, abs=1e-15), f"step {step}"
        theirs_opt.step(), ours_opt.step()
        theirs.step(), ours.step()


def test_schedule_goyal_warmup_rises_every_iteration_from_base_lr():
    k, base, warmup = 32, 0.1, 10
    lrs = [lr_at(s, k * base, warmup, 1 / k, "step", (100,)) for s in range(warmup + 2)]
    assert lrs[0] == pytest.approx(base)  # not 0: the small batch's rate
    assert all(b > a for a, b in zip(lrs[:warmup], lrs[1:warmup + 1]))  # every iteration
    assert lrs[warmup] == lrs[warmup + 1] == pytest.approx(k * base)


def test_schedule_refuses_bad_settings():
    for bad in (dict(warmup_steps=-1), dict(start_factor=0.0), dict(start_factor=2.0),
                dict(decay="linear"), dict(decay="cosine", total_steps=3, warmup_steps=3),
                dict(decay="step", milestones=(5, 2))):
        with pytest.raises(ValueError):
            lr_at(0, 0.1, **bad)


# ---- LARS --------------------------------------------------------------------------------


def _lars_reference(weights, grads_per_step, lrs, momentum, wd, eta, eps):
    """The paper's Algorithm 1 per tensor, in float64 Python arithmetic on lists."""
    ws = [w.double().clone() for w in weights]
    vs = [torch.zeros_like(w) for w in ws]
    for grads, lr in zip(grads_per_step, lrs):
        for i, (w, g) in enumerate(zip(ws, grads)):
            if g is None:
                continue
            g = g.double()
            if w.dim() > 1:
                wn, gn = math.sqrt(float((w * w).sum())), math.sqrt(float((g * g).sum()))
                trust = eta * wn / (gn + wd * wn + eps) if wn > 0 and gn > 0 else 1.0
                vs[i] = momentum * vs[i] + lr * trust * (g + wd * w)
            else:
                vs[i] = momentum * vs[i] + lr * g
            ws[i] = w - vs[i]
    return ws


def _lars_case(shapes, steps, momentum=0.9, wd=0.0, eta=0.001, eps=1e-8, lrs=None, none=(),
               zero=()):
    gen = torch.Generator().manual_seed(len(shapes) + steps)
    weights = [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]
    for i in zero:
        weights[i].zero_()  # |w| = 0: trust 1
    grads = [[None if (t, i) in none else
              (torch.zeros(s, dtype=torch.float64) if (t, -i - 1) in none else
               torch.randn(s, generator=gen, dtype=torch.float64) * 10 ** (i - 1))
              for i, s in enumerate(shapes)] for t in range(steps)]
    lrs = lrs or [0.5] * steps
    params = [nn.Parameter(w.clone()) for w in weights]
    opt = LARS(params, lrs[0], momentum=momentum, weight_decay=wd, trust_coefficient=eta,
               eps=eps)
    for t in range(steps):
        for group in opt.param_groups:
            group["lr"] = lrs[t]
        for p, g in zip(params, grads[t]):
            p.grad = None if g is None else g.clone()
        opt.step()
    expected = _lars_reference(weights, grads, lrs, momentum, wd, eta, eps)
    for i, (p, e) in enumerate(zip(params, expected)):
        torch.testing.assert_close(p.detach(), e, rtol=1e-12, atol=1e-14,
                                   msg=lambda m: f"parameter {i} {tuple(p.shape)}: {m}")
    return params


@pytest.mark.parametrize("options", [
    dict(), dict(wd=5e-4), dict(momentum=0.0, wd=0.01, eta=0.02),
    dict(lrs=[0.1, 0.4, 0.9, 0.2, 0.05], wd=1e-4),  # warmup then decay: lr changes each step
    dict(eps=0.5, eta=1.0)], ids=["plain", "decay", "no-momentum", "changing-lr", "big-eps"])
def test_lars_equals_algorithm_1(options):
    # weights of very different scales (10^-1 .. 10^2 gradients), odd shapes, 1-D tensors
    _lars_case([(3, 5), (5,), (2, 3, 2, 1), (1,), (4, 1)], 5, **options)


def test_lars_awkward_tensors():
    # a zero weight (trust 1), a zero gradient at step 1 (trust 1), a missing gradient at
    # step 2 (no step, velocity kept), a 1x1 matrix (still a matrix: trust ratio applies)
    _lars_case([(3, 4), (2, 2), (1, 1), (6,)], 4, wd=1e-3, zero=(0,),
               none={(1, -2), (2, 1), (2, 3)})


def test_lars_is_sgd_when_every_parameter_is_one_dimensional():
    torch.manual_seed(0)
    ours = [nn.Parameter(torch.randn(7, dtype=torch.float64)) for _ in range(3)]
    theirs = [nn.Parameter(p.detach().clone()) for p in ours]
    a = LARS(ours, 0.05, momentum=0.9, weight_decay=0.1)  # weight decay: not for 1-D tensors
    b = torch.optim.SGD(theirs, 0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(3)
    for _ in range(6):
        for p, q in zip(ours, theirs):
            p.grad = torch.randn(7, generator=gen, dtype=torch.float64)
            q.grad = p.grad.clone()
        a.step(), b.step()
    for p, q in zip(ours, theirs):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-14)


def test_lars_trust_ratio_makes_the_step_a_fraction_of_the_weight():
    w = nn.Parameter(torch.full((4, 4), 2.0, dtype=torch.float64))
    w.grad = torch.full((4, 4), 1e6, dtype=torch.float64)  # a huge gradient
    before = w.detach().clone()
    LARS([w], lr=1.0, momentum=0.0, trust_coefficient=0.01).step()
    assert ((w.detach() - before).norm() / before.norm()).item() == pytest.approx(0.01, rel=1e-6)


def test_lars_refuses_negative_settings_and_keeps_state_dict():
    with pytest.raises(ValueError):
        LARS([nn.Parameter(torch.ones(2, 2))], lr=-0.1)
    p = nn.Parameter(torch.ones(2, 2))
    p.grad = torch.ones(2, 2)
    opt = LARS([p], lr=0.1)
    opt.step()
    q = nn.Parameter(p.detach().clone())
    again = LARS([q], lr=0.1)
    again.load_state_dict(opt.state_dict())
    torch.testing.assert_close(again.state[q]["velocity"], opt.state[p]["velocity"])


# ---- the noise scale -----------------------------------------------------------------------


def _noise_trials(trials, dim=20, b_small=4, b_big=32, seed=0):
    """Per-example gradients G + e, e ~ N(0, Sigma) with a known diagonal Sigma: the squared
    norms of a small batch's mean and of a big batch's mean (the small one inside it, as a
    rank's batch is inside the global one)."""
    gen = torch.Generator().manual_seed(seed)
    G = torch.linspace(-1, 1, dim, dtype=torch.float64)
    sd = torch.linspace(0.5, 3.0, dim, dtype=torch.float64)
    examples = G + sd * torch.randn(trials, b_big, dim, generator=gen, dtype=torch.float64)
    small = examples[:, :b_small].mean(1).square().sum(1)
    big = examples.mean(1).square().sum(1)
    return small, big, float(G.square().sum()), float(sd.square().sum())


def test_two_batch_estimates_are_unbiased():
    trials, b_small, b_big = 4000, 4, 32
    small, big, g2, trace = _noise_trials(trials, b_small=b_small, b_big=b_big)
    est_g2, est_trace = two_batch_estimates(small, big, b_small, b_big)
    for name, est, true in (("|G|^2", est_g2, g2), ("tr(Sigma)", est_trace, trace)):
        # The mean of `trials` independent estimates has standard error sd / sqrt(trials);
        # 5 standard errors: a correct estimator fails with probability ~6e-7 (fixed seed).
        tolerance = 5 * est.std().item() / math.sqrt(trials)
        assert abs(est.mean().item() - true) < tolerance, f"{name}: {est.mean():.3f} vs {true}"
    # One batch size cannot separate them: |G_big|^2 alone overestimates |G|^2 by
    # tr(Sigma) / b_big, far beyond that tolerance (so this test can fail).
    assert big.mean().item() - g2 > 5 * big.std().item() / math.sqrt(trials)


def test_noise_scale_moving_averages_give_b_simple():
    small, big, g2, trace = _noise_trials(6000)
    scale = NoiseScale(decay=0.999)
    for s, b in zip(small.tolist(), big.tolist()):
        scale.update(s, b, 4, 32)
    assert scale.b_simple == pytest.approx(trace / g2, rel=0.15)
    with pytest.raises(ValueError, match="one batch size"):
        two_batch_estimates(1.0, 1.0, 8, 8)
    assert NoiseScale().b_simple == float("inf")


def test_fit_steps_recovers_s_min_and_e_min_and_flat_range():
    s_min, e_min = 120.0, 50_000.0
    batches = [64, 128, 256, 512, 1024, 2048]
    got = fit_steps(batches, [s_min + e_min / b for b in batches])
    assert got == pytest.approx((s_min, e_min), rel=1e-9)
    rows = [{"recipe": "x", "batch": b, "seed": s, "test_accuracy": a + s * 0.2}
            for b, a in ((32, 88.0), (64, 88.5), (128, 87.6), (256, 86.0), (512, 88.0))
            for s in (0, 1)]
    table = accuracy_table(rows)
    assert table["x", 64] == pytest.approx((88.6, 88.5, 88.7))
    assert flat_range(table, "x") == (32, 128)  # 512 is within 1 point but past a gap


# ---- SyncBatchNorm ---------------------------------------------------------------------------

SYNC_CASES = [  # (shape of one item, channels, local batch per rank as a function of rank)
    ("2d", (5,), lambda r: 3),
    ("3d uneven", (4, 7), lambda r: r + 1),  # ranks of 1, 2, 3, 4 items
    ("4d uneven", (3, 5, 3), lambda r: (2, 5, 1, 3)[r]),
]


def _global_batch(item_shape, sizes, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(sum(sizes), *item_shape, generator=gen, dtype=dtype) * 3 + 1
    w = torch.randn(sum(sizes), *item_shape, generator=gen, dtype=dtype)  # weights the loss
    return x, w


def _syncbn_cases(rank, world_size):
    from dist_sgd.large_batch.syncbn import SyncBatchNorm
    import torch.distributed as dist
    worst = {}
    for name, item, size in SYNC_CASES:
        sizes = [size(r) for r in range(world_size)]
        mine = slice(sum(sizes[:rank]), sum(sizes[:rank + 1]))
        for options in (dict(), dict(affine=False), dict(momentum=None),
                        dict(track_running_stats=False)):
            x, w = _global_batch(item, sizes, torch.float64, seed=len(worst))
            ref = (nn.BatchNorm1d if len(item) < 3 else nn.BatchNorm2d)(item[0], **options)
            ref = ref.double()
            ours = SyncBatchNorm(item[0], **options).double()
            if ref.affine:
                with torch.no_grad():
                    ref.weight.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(1))
                    ref.bias.uniform_(-1, 1, generator=torch.Generator().manual_seed(2))
                    ours.weight.copy_(ref.weight), ours.bias.copy_(ref.bias)
            for step in range(2):  # two steps: running statistics and num_batches_tracked
                xg = (x + step).requires_grad_()
                xl = (x + step)[mine].clone().requires_grad_()
                yg, yl = ref(xg), ours(xl)
                (yg * w).sum().backward()
                (yl * w[mine]).sum().backward()
                diffs = {"output": (yl - yg[mine]), "input grad": xl.grad - xg.grad[mine]}
                if ref.affine:
                    for pname in ("weight", "bias"):
                        g = getattr(ours, pname).grad.clone()
                        dist.all_reduce(g)  # local; DDP would average, the sum is the global
                        diffs[pname + " grad"] = g - getattr(ref, pname).grad
                        getattr(ours, pname).grad = getattr(ref, pname).grad = None
                if ref.track_running_stats:
                    diffs["running_mean"] = ours.running_mean - ref.running_mean
                    diffs["running_var"] = ours.running_var - ref.running_var
                    diffs["num_batches_tracked"] = (ours.num_batches_tracked -
                                                    ref.num_batches_tracked).double()
                for what, d in diffs.items():
                    key = f"{name} {options} {what}"
                    worst[key] = max(worst.get(key, 0.0), d.abs().max().item())
            ours.eval(), ref.eval()  # eval: the running statistics (or the batch's, untracked)
            if ref.track_running_stats:
                worst[f"{name} {options} eval output"] = \
                    (ours(x[mine]) - ref(x[mine])).abs().max().item()
    # convert_sync_batchnorm on a model: weights, statistics and mode carried over
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                          nn.Linear(16, 6), nn.BatchNorm1d(6, momentum=0.3)).double()
    sizes = [r + 2 for r in range(world_size)]
    mine = slice(sum(sizes[:rank]), sum(sizes[:rank + 1]))
    x, _ = _global_batch((2, 4, 4), sizes, torch.float64, seed=7)
    w = torch.randn(sum(sizes), 6, generator=torch.Generator().manual_seed(8),
                    dtype=torch.float64)
    reference = model
    ours = SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(model))
    kinds = [type(m).__name__ for m in ours.modules()]
    assert kinds.count("SyncBatchNorm") == 2 and "BatchNorm2d" not in kinds, kinds
    for step in range(2):
        reference.zero_grad(), ours.zero_grad()
        (reference(x + step) * w).sum().backward()
        (ours((x + step)[mine]) * w[mine]).sum().backward()
    for (n, p), q in zip(ours.named_parameters(), reference.parameters()):
        g = p.grad.clone()
        dist.all_reduce(g)
        worst[f"model {n} grad"] = (g - q.grad).abs().max().item()
    for (n, b), c in zip(ours.named_buffers(), reference.buffers()):
        worst[f"model {n}"] = (b.double() - c.double()).abs().max().item()
    # a global batch of one item per channel is refused on every rank, as BatchNorm refuses it
    one = SyncBatchNorm(3).double()
    refused = False
    try:
        one(torch.ones(1 if rank == 0 else 0, 3, dtype=torch.float64))
    except ValueError as e:
        refused = "more than 1 value" in str(e)
    worst["refused a global batch of 1"] = 0.0 if refused else 1.0
    return worst


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_syncbn_equals_batchnorm_on_the_global_batch(world_size):
    for worst in launch(_syncbn_cases, world_size, backend="gloo"):
        bad = {k: v for k, v in worst.items() if not v <= 1e-10}
        assert not bad, f"world size {world_size}: {bad}"
        assert len(worst) > 40


def test_syncbn_without_a_group_is_batchnorm():
    from dist_sgd.large_batch.syncbn import SyncBatchNorm
    x = torch.randn(6, 3, 4, dtype=torch.float64)
    ours, ref = SyncBatchNorm(3).double(), nn.BatchNorm1d(3).double()
    torch.testing.assert_close(ours(x), ref(x))
    torch.testing.assert_close(ours.running_var, ref.running_var)
    with pytest.raises(ValueError, match="at least 2D"):
        ours(torch.ones(3))
    with pytest.raises(TypeError, match="process_group"):
        SyncBatchNorm(3, process_group=object())



# ---- ghost BatchNorm: BatchNorm per simulated worker ---------------------------------------

@pytest.mark.parametrize("n, group, features", [(3 * 64, 64, 7), (5 * 4, 4, 3), (6, 8, 5)])
def test_ghost_batchnorm_is_batchnorm_on_each_group(n, group, features):
    """Output, gradients (input, weight, bias) and running statistics equal k BatchNorms each
    run on its own `group` consecutive items (a batch under the group: one BatchNorm on all)."""
    from dist_sgd.large_batch.ghostbn import GhostBatchNorm1d
    gen = torch.Generator().manual_seed(n)
    x = (torch.randn(n, features, generator=gen, dtype=torch.float64) * 3 + 1)
    w = torch.randn(n, features, generator=gen, dtype=torch.float64)  # weights the loss
    ours = GhostBatchNorm1d(features, group, momentum=0.3).double()
    with torch.no_grad():
        ours.weight.copy_(torch.randn(features, generator=gen))
        ours.bias.copy_(torch.randn(features, generator=gen))
    start = copy.deepcopy(ours.state_dict())
    xo = x.clone().requires_grad_()
    got = ours(xo)
    (got * w).sum().backward()
    g = min(group, n)
    refs, outs, xgrads = [], [], []
    for i in range(0, n, g):  # one BatchNorm per simulated worker, on its items only
        ref = nn.BatchNorm1d(features, momentum=0.3).double()
        ref.load_state_dict(start)
        xi = x[i:i + g].clone().requires_grad_()
        out = ref(xi)
        (out * w[i:i + g]).sum().backward()
        refs.append(ref), outs.append(out), xgrads.append(xi.grad)
    torch.testing.assert_close(got, torch.cat(outs))
    torch.testing.assert_close(xo.grad, torch.cat(xgrads))
    torch.testing.assert_close(ours.weight.grad, sum(r.weight.grad for r in refs))
    torch.testing.assert_close(ours.bias.grad, sum(r.bias.grad for r in refs))
    # the running statistics: the mean of the workers' own
    torch.testing.assert_close(ours.running_mean, sum(r.running_mean for r in refs) / len(refs))
    torch.testing.assert_close(ours.running_var, sum(r.running_var for r in refs) / len(refs))
    ours.eval()  # eval: the running statistics, as BatchNorm
    refs[0].eval()
    refs[0].running_mean.copy_(ours.running_mean)
    refs[0].running_var.copy_(ours.running_var)
    torch.testing.assert_close(ours(x), refs[0](x))


def test_ghost_batchnorm_refuses_a_batch_of_partial_groups():
    from dist_sgd.large_batch.ghostbn import GhostBatchNorm1d, GhostMLP
    bn = GhostBatchNorm1d(3, group=4)
    with pytest.raises(ValueError, match="whole groups"):
        bn(torch.randn(6, 3))
    with pytest.raises(ValueError, match="batch, features"):
        bn(torch.randn(8, 3, 2))
    assert GhostMLP(16, group=4)(torch.randn(8, 1, 28, 28)).shape == (8, 10)

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="needs 2 GPUs (torch's SyncBatchNorm runs on GPUs only)")
def test_syncbn_equals_torchs_on_two_gpus_nccl():
    from test_gpu import _syncbn_against_torchs
    results = launch(_syncbn_against_torchs, 2, None, backend="nccl")
    assert max(results) < 1e-5, results
