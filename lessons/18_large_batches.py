"""Lesson 18: large batches. What distributing SGD does to learning, and the recipe for it.

Every lesson so far asked how fast a step runs on more ranks. In practice each rank keeps its
batch b, so k ranks train with a global batch B = k b, and an epoch takes k times fewer steps.
How many steps does the bigger batch need? Goyal et al. 2017 (ResNet-50 on ImageNet, 90
epochs): with the linear scaling rule (lr = base_lr x B / 256) and a gradual warmup (from
base_lr up to k x base_lr, rising every iteration for 5 epochs) top-1 error stays at 23.5-23.7%
from batch 256 to 8k, then rises: 24.8% at 16k, 27.6% at 32k, 34.0% at 64k. At 8k without
warmup: 24.8%; with square-root scaling 26.2%; with no scaling 41.7%.

  1. k workers, simulated: a global batch of k b on k ranks (average_gradients) is the same
     update as k micro-batches accumulated in one process, each loss divided by k. So the
     benchmark's curve runs big batches on few processes, as Goyal's runs at >= 12k did.
  2. Goyal's pitfalls: the loss normalized by the global batch (lesson 06's rule); weight decay
     not scaled with the loss; momentum correction; per-rank BatchNorm statistics against
     synchronized ones (SyncBatchNorm from all-reduce: torch's refuses CPU tensors).
  3. The recipe, built and trained here (recipe() and train() below): the learning rate scaled
     linearly with the batch, reached by a gradual warmup (torch's LinearLR, then a cosine),
     and LARS (You et al. 2017: a trust ratio per layer, dist_sgd/large_batch/lars.py) on top.
     The same MLP runs at the small batch (each rank 64 items) and at 8 times that, unscaled,
     linear, linear with warmup, and LARS with warmup: the same epochs, so the big batch takes
     8 times fewer steps. BatchNorm is per 64 items (ghost BatchNorm, as Goyal's per-worker
     BatchNorm): it is what lets the network take the large rates linear scaling asks for.
     Along the way data parallelism measures the gradient noise scale B_simple = tr(Sigma) /
     |G|^2 (McCandlish et al. 2018) for free: each rank's gradient (batch b) and the average
     (batch k b) are two batch sizes of the same gradient (dist_sgd/large_batch/noise.py).
     Below B_simple a bigger batch saves steps; above it, it mostly costs examples.

The whole curve, 32 to 8192, five recipes, steps to a target and B_crit, is the benchmark's
(figures/README.md, "Accuracy against the global batch"): ~15 minutes on 2 cores, too long for
a lesson; it trains with the recipe written here.

Run:
    python lessons/18_large_batches.py --world-size 4
    python lessons/18_large_batches.py --quick
    python -m dist_sgd.bench large_batch --save-figures    # the curve (~15 min, 2 cores)

Exercises:
  1. In part 1 drop the `/ k` of the accumulated losses: which check fails, by how much?
  2. Part 3 at --world-size 2 and 4: is B_simple the same? Which estimate is noisier, and why?
  3. In part 3 set warm = 0 for "warmup" and LARS too: which falls, and by how much? And at
     GROUPS = 32 (a batch 32 times each rank's)?
  4. Write the pieces yourself, each graded against torch's or its definition:
     `python3 -m dist_sgd.course start warmup_schedule` (then `check warmup_schedule`), and
     `python3 -m dist_sgd.course start LARS`, `... course start noise_scale`,
     `... course start SyncBatchNorm`.
"""
import copy

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.optim import lr_scheduler

from dist_sgd.large_batch.ghostbn import GhostMLP
from dist_sgd.large_batch.lars import LARS
from dist_sgd.large_batch.noise import NoiseScale
from dist_sgd.large_batch.schedule import lr_at
from dist_sgd.large_batch.syncbn import SyncBatchNorm
from dist_sgd.plumbing.check import check, max_diff
from dist_sgd.plumbing.launch import launch, lesson_parser
from dist_sgd.plumbing.rank import device, log
from dist_sgd.sgd.data import get_dataset
from dist_sgd.sgd.models import MLP
from dist_sgd.sgd.sync import average_gradients

B, LR, TOL, HIDDEN = 32, 0.05, 1e-12, 128  # per-rank batch; an MLP(hidden=128)
# Part 3: base_lr at each rank's 64 items (LARS: its own rate and trust coefficient, a step of
# lr x TRUST x |w| per layer), the big batch GROUPS x 64 items per rank
BASE, BASE_LR, LARS_LR, TRUST, MOMENTUM, GROUPS = 64, 0.01, 0.05, 0.02, 0.9, 8


def sgd_step(model, batches, lr, scale=1.0, weight_decay=0.0, sync=False):
    """One step of torch's SGD on the sum of the micro-batches' losses, each times scale."""
    opt = torch.optim.SGD(model.parameters(), lr, weight_decay=weight_decay)
    for x, y in batches:
        (F.nll_loss(model(x), y) * scale).backward()
    if sync:  # the ranks' gradients averaged: lesson 06
        average_gradients(model)
    opt.step()
    return model


def recipe(model, name, batch, steps, warmup):
    """Goyal's recipe at global `batch`: (optimizer, lr schedule), stepped once per step."""
    k = batch / BASE  # the linear scaling rule: k times the batch, k times the rate
    peak = (LARS_LR if name == "LARS" else BASE_LR) * (1 if name == "none" else k)
    # LARS: a trust ratio per layer, so each step is a fixed fraction of the layer's |w|
    opt = LARS(model.parameters(), peak, MOMENTUM, trust_coefficient=TRUST) if name == "LARS" \
        else torch.optim.SGD(model.parameters(), peak, MOMENTUM)
    warm = warmup if name in ("warmup", "LARS") else 0
    decay = lr_scheduler.CosineAnnealingLR(opt, T_max=steps - warm)  # then a cosine to 0
    if not warm:
        return opt, decay
    # Goyal's gradual warmup: from base_lr (1 / k of the peak), the same rise every step
    rise = lr_scheduler.LinearLR(opt, start_factor=1 / k, total_iters=warm)
    return opt, lr_scheduler.SequentialLR(opt, [rise, decay], milestones=[warm])


def train(rank, k, name, per_rank, epochs, x, y, test_x, test_y):
    """(model, lrs, test accuracy %, B_simple): `epochs` of SGD, `per_rank` items a rank."""
    batch, steps = per_rank * k, len(x) // (per_rank * k)
    torch.manual_seed(0)  # the same start on every rank
    # BatchNorm per 64 items, as Goyal's per-worker BatchNorm (the large rates need it)
    model = GhostMLP(HIDDEN, group=BASE).to(device())
    opt, sched = recipe(model, name, batch, epochs * steps, steps)  # 1 epoch of warmup
    lrs, noise = [], NoiseScale(decay=0.9)
    for epoch in range(epochs):
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(epoch))
        for s in range(steps):
            mine = order[s * batch:(s + 1) * batch].view(k, per_rank)[rank]
            model.zero_grad()
            F.nll_loss(model(x[mine]), y[mine]).backward()
            local = sum(p.grad.square().sum() for p in model.parameters()).reshape(1)
            dist.all_reduce(local)  # |G_b|^2 of each rank's own batch b, averaged: one scalar
            average_gradients(model)  # the mean over the global batch (lesson 06)
            if k > 1:  # the gradient at two batch sizes, b and k b, for free: the noise scale
                big = sum(p.grad.square().sum() for p in model.parameters()).item()
                noise.update(local.item() / k, big, per_rank, batch)
            lrs.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
    accuracy = (model.eval()(test_x).argmax(1) == test_y).double().mean().item()
    return model, lrs, 100 * accuracy, noise.b_simple


def run(rank, k, args):
    x, y = (t.to(device()) for t in get_dataset(args.dataset, quiet=True).tensors)
    log(f"1. {k} ranks of batch {B} against {k} micro-batches accumulated in one process")
    torch.manual_seed(0)
    start = MLP(HIDDEN).double().to(device())
    xs = [(x[i * B:(i + 1) * B].double(), y[i * B:(i + 1) * B]) for i in range(k)]
    ranks = sgd_step(copy.deepcopy(start), [xs[rank]], LR * k, sync=True)
    single = sgd_step(copy.deepcopy(start), xs, LR * k, scale=1 / k)  # lesson 06's rule
    log("   " + check(f"{k} ranks' update vs accumulation", max_diff(ranks, single), TOL))

    log("\n2. Goyal's pitfalls (the loss normalized by the global batch: lesson 06, part 1)")
    w0 = MLP(8).double().to(device())
    lr_k = sgd_step(copy.deepcopy(w0), xs[:1], LR * k, weight_decay=1e-2)
    loss_k = sgd_step(copy.deepcopy(w0), xs[:1], LR, scale=k, weight_decay=1e-2)
    log(f"   loss x {k} instead of lr x {k}, same weight decay: differ by "
        f"{max_diff(lr_k, loss_k):.2e} (the decay is added to the gradient, not scaled)")
    fixed = sgd_step(copy.deepcopy(w0), xs[:1], LR, scale=k, weight_decay=1e-2 * k)
    log("   " + check(f"loss x {k}, weight decay x {k} vs lr x {k}", max_diff(lr_k, fixed), TOL))
    gen, m = torch.Generator().manual_seed(3), 0.9
    grads = torch.randn(8, 5, generator=gen, dtype=torch.float64).to(device())
    lrs = [LR * (1 + 3 * t / 7) for t in range(8)]  # a warmup: lr changes every step
    w = wu = wc = torch.zeros(5, dtype=torch.float64, device=device())  # three ways to step
    v = u = uc = torch.zeros_like(w)  # their velocities
    for t, (g, lr) in enumerate(zip(grads, lrs)):
        v, u = m * v + g, m * u + lr * g  # torch's SGD: v holds gradients; the paper's: lr x g
        uc = m * (lr / lrs[max(t - 1, 0)]) * uc + lr * g  # the paper's, momentum corrected
        w, wu, wc = w - lr * v, wu - u, wc - uc
    log(f"   velocity holding lr x g, lr warming up: differs from torch's by {max_diff(w, wu):.2e}")
    log("   " + check("momentum corrected (x lr_t / lr_t-1) vs torch's", max_diff(w, wc), TOL))
    sizes = [2 + r for r in range(k)]  # uneven local batches
    feats = torch.randn(sum(sizes), 6, generator=gen, dtype=torch.float64).to(device()) * 2 + 1
    here = slice(sum(sizes[:rank]), sum(sizes[:rank + 1]))
    whole = nn.BatchNorm1d(6).double().to(device())(feats)[here]
    local = nn.BatchNorm1d(6).double().to(device())(feats[here])
    log(f"   per-rank BatchNorm vs BatchNorm on the global batch: differs by "
        f"{max_diff(local, whole):.2e} (rank 0's items)")
    ours = SyncBatchNorm(6).double().to(device())(feats[here])  # all-reduced statistics
    log("   " + check("SyncBatchNorm vs BatchNorm on the global batch", max_diff(ours, whole), TOL))
    try:  # torch's own: on GPUs (NCCL) it runs, on CPU tensors it refuses
        theirs = nn.SyncBatchNorm(6).double().to(device())(feats[here])
        log("   " + check("SyncBatchNorm vs torch's", max_diff(ours, theirs), TOL))
    except ValueError as e:
        log(f"   torch.nn.SyncBatchNorm on CPU: {e}")
    recipes(rank, k, x, y, args)


def recipes(rank, k, x, y, args):
    items, epochs, big = (6000, 4, GROUPS * BASE) if args.quick else (20000, 6, GROUPS * BASE)
    test_x, test_y = get_dataset(args.dataset, train=False, quiet=True).tensors
    data = [t.to(device()) for t in (x[:items], y[:items], test_x[:2000], test_y[:2000])]
    log(f"\n3. the recipe, trained: {epochs} epochs of {items} items on {k} ranks, warmup 1 "
        f"epoch; test accuracy on {len(data[2])}, the peak lr, B_simple at the end")
    for name, per_rank in (("linear", BASE), ("none", big), ("linear", big), ("warmup", big),
                           ("LARS", big)):
        model, lrs, accuracy, b_simple = train(rank, k, name, per_rank, epochs, *data)
        log(f"   batch {k * per_rank:5d}, {name:>6s}: {accuracy:5.1f}%, lr {max(lrs):.3f}, "
            f"B_simple {b_simple:.0f}")
    # LARS's rates (torch's LinearLR, then CosineAnnealingLR) against the rate in closed form
    formula = [lr_at(t, LARS_LR * big / BASE * k, len(lrs) // epochs, BASE / (big * k),
                     "cosine", total_steps=len(lrs)) for t in range(len(lrs))]
    log("   " + check("LARS's lr, step by step, vs warmup + cosine", max_diff(lrs, formula), TOL))
    # float32 on GPUs too, but every rank ran the same operations: TF32 cannot tell them apart
    mine = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
    first = mine.clone()
    dist.broadcast(first, 0)
    log("   " + check("LARS: every rank's weights vs rank 0's", max_diff(mine, first), 0))


if __name__ == "__main__":
    args = lesson_parser(__doc__).parse_args()
    args.dataset = get_dataset("auto").name  # chosen once, here: every rank reads the same
    launch(run, args.world_size, args, backend=args.backend)
