"""Lesson 18: large batches. What distributing SGD does to learning, measured.

Every lesson so far asked how fast a step runs on more ranks. In practice each rank keeps its
batch b, so k ranks train with a global batch B = k b, and an epoch takes k times fewer steps.
How many steps does the bigger batch need? Goyal et al. 2017 (ResNet-50 on ImageNet, 90
epochs): with the linear scaling rule (lr = base_lr x B / 256) and a gradual warmup (from
base_lr up to k x base_lr, rising every iteration for 5 epochs) top-1 error stays at 23.5-23.7%
from batch 256 to 8k, then rises: 24.8% at 16k, 27.6% at 32k, 34.0% at 64k. At 8k without
warmup: 24.8%; with square-root scaling 26.2%; with no scaling 41.7%.

  1. k workers, simulated: a global batch of k b on k ranks (average_gradients) is the same
     update as k micro-batches accumulated in one process, each loss divided by k. So the
     curve below runs big batches on few processes, as Goyal's runs at >= 12k did.
  2. The gradient noise scale B_simple = tr(Sigma) / |G|^2 (McCandlish et al. 2018): below it
     a bigger batch saves steps, above it mostly costs examples. Data parallelism measures it
     for free: each rank's gradient (batch b) and the average (batch k b) are two batch sizes
     of the same gradient (dist_sgd/large_batch/noise.py).
  3. Goyal's pitfalls: the loss normalized by the global batch (lesson 06's rule); weight decay
     not scaled with the loss; momentum correction; per-rank BatchNorm statistics against
     synchronized ones (SyncBatchNorm from all-reduce: torch's refuses CPU tensors).

  4. The curve (figures/large_batch.png): test accuracy against the global batch, 32 to 8192,
     the same epochs, five recipes: no scaling, square root, linear, linear with warmup, LARS
     (dist_sgd/large_batch/lars.py); where each falls off, against Goyal's table. Goyal's
     ResNet computes BatchNorm per worker over its own 32 items; the curve's MLP does the same
     for each simulated worker's 64 (ghost BatchNorm, dist_sgd/large_batch/ghostbn.py), which
     lets it take the large rates linear scaling asks for. Steps to a target against the
     batch, fitted to (S/S_min - 1)(E/E_min - 1) = 1: B_crit = E_min/S_min.
  5. Time to accuracy against workers: S(B = k b) steps times a step at k workers (the cost
     model of lesson 10): past some k more workers no longer pay, and why.

Run:
    python lessons/18_large_batches.py --world-size 4
    python lessons/18_large_batches.py --quick
    python -m dist_sgd.bench large_batch --save-figures    # the curve itself (~15 min, 2 cores)

Exercises:
  1. In part 1 drop the `/ k` of the accumulated losses: which check fails, by how much?
  2. Part 2 at --world-size 2 and 4: is B_simple the same? Which estimate is noisier, and why?
  3. Write the pieces yourself, each graded against torch's or its definition:
     `python3 -m dist_sgd.course start warmup_schedule` (then `check warmup_schedule`), and
     `python3 -m dist_sgd.course start LARS`, `... course start noise_scale`,
     `... course start SyncBatchNorm`.
"""
import copy
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from dist_sgd.large_batch.curve import summary, width
from dist_sgd.large_batch.ghostbn import GhostMLP
from dist_sgd.large_batch.noise import NoiseScale
from dist_sgd.large_batch.syncbn import SyncBatchNorm
from dist_sgd.plumbing.check import check, max_diff
from dist_sgd.plumbing.figures import read_csv
from dist_sgd.plumbing.launch import launch, lesson_parser
from dist_sgd.plumbing.rank import log
from dist_sgd.scale.costmodel import link, predict_step
from dist_sgd.sgd.data import get_dataset
from dist_sgd.sgd.models import MLP
from dist_sgd.sgd.sync import average_gradients

B, LR, TOL, HIDDEN = 32, 0.05, 1e-12, 128  # per-rank batch; an MLP(hidden=128)
CURVE_HIDDEN = 256  # the curve's GhostMLP: part 5's step time and all-reduce size
GOYAL = {256: 23.60, 8192: 23.74, 16384: 24.79, 32768: 27.55, 65536: 33.96}


def sgd_step(model, batches, lr, scale=1.0, weight_decay=0.0, sync=False):
    """One step of torch's SGD on the sum of the micro-batches' losses, each times scale."""
    opt = torch.optim.SGD(model.parameters(), lr, weight_decay=weight_decay)
    for x, y in batches:
        (F.nll_loss(model(x), y) * scale).backward()
    if sync:  # the ranks' gradients averaged: lesson 06
        average_gradients(model)
    opt.step()
    return model


def run(rank, k, args):
    x, y = get_dataset(args.dataset, quiet=True).tensors
    log(f"1. {k} ranks of batch {B} against {k} micro-batches accumulated in one process")
    torch.manual_seed(0)
    start = MLP(HIDDEN).double()
    xs = [(x[i * B:(i + 1) * B].double(), y[i * B:(i + 1) * B]) for i in range(k)]
    ranks = sgd_step(copy.deepcopy(start), [xs[rank]], LR * k, sync=True)
    single = sgd_step(copy.deepcopy(start), xs, LR * k, scale=1 / k)  # lesson 06's rule
    log("   " + check(f"{k} ranks' update vs accumulation", max_diff(ranks, single), TOL))

    if k > 1:
        log(f"\n2. the gradient noise scale, batch {B} per rank against {k * B} averaged")
        model, noise = MLP(HIDDEN), NoiseScale(decay=0.9)
        opt = torch.optim.SGD(model.parameters(), LR * k, momentum=0.9)
        steps = 60 if args.quick else 300
        for step in range(steps):
            first = (step * k + rank) * B % (len(x) - B)
            model.zero_grad()
            F.nll_loss(model(x[first:first + B]), y[first:first + B]).backward()
            local = torch.stack([sum(p.grad.square().sum() for p in model.parameters())])
            dist.all_reduce(local)  # |G_b|^2, averaged over the ranks: one scalar more
            average_gradients(model)
            big = sum(p.grad.square().sum() for p in model.parameters()).item()
            noise.update(local.item() / k, big, B, k * B)
            opt.step()
            if (step + 1) % (steps // 5) == 0:
                log(f"   step {step + 1:4d}: |G_{B}|^2 {local.item() / k:.4f}, |G_{k * B}|^2 "
                    f"{big:.4f} -> B_simple {noise.b_simple:.0f} (moving averages)")

    log("\n3. Goyal's pitfalls (the loss normalized by the global batch: lesson 06, part 1)")
    w0 = MLP(8).double()
    lr_k = sgd_step(copy.deepcopy(w0), xs[:1], LR * k, weight_decay=1e-2)
    loss_k = sgd_step(copy.deepcopy(w0), xs[:1], LR, scale=k, weight_decay=1e-2)
    log(f"   loss x {k} instead of lr x {k}, same weight decay: differ by "
        f"{max_diff(lr_k, loss_k):.2e} (the decay is added to the gradient, not scaled)")
    fixed = sgd_step(copy.deepcopy(w0), xs[:1], LR, scale=k, weight_decay=1e-2 * k)
    log("   " + check(f"loss x {k}, weight decay x {k} vs lr x {k}", max_diff(lr_k, fixed), TOL))
    gen, m = torch.Generator().manual_seed(3), 0.9
    grads = torch.randn(8, 5, generator=gen, dtype=torch.float64)
    lrs = [LR * (1 + 3 * t / 7) for t in range(8)]  # a warmup: lr changes every step
    w, wu, wc, v, u, uc = (torch.zeros(5, dtype=torch.float64) for _ in range(6))
    for t, (g, lr) in enumerate(zip(grads, lrs)):
        v, u = m * v + g, m * u + lr * g  # torch's SGD: v holds gradients; the paper's: lr x g
        uc = m * (lr / lrs[max(t - 1, 0)]) * uc + lr * g  # the paper's, momentum corrected
        w, wu, wc = w - lr * v, wu - u, wc - uc
    log(f"   velocity holding lr x g, lr warming up: differs from torch's by {max_diff(w, wu):.2e}")
    log("   " + check("momentum corrected (x lr_t / lr_t-1) vs torch's", max_diff(w, wc), TOL))
    sizes = [2 + r for r in range(k)]  # uneven local batches
    feats = torch.randn(sum(sizes), 6, generator=gen, dtype=torch.float64) * 2 + 1
    mine = feats[sum(sizes[:rank]):sum(sizes[:rank + 1])]
    whole = nn.BatchNorm1d(6).double()(feats)[sum(sizes[:rank]):sum(sizes[:rank + 1])]
    log(f"   per-rank BatchNorm vs BatchNorm on the global batch: differs by "
        f"{max_diff(nn.BatchNorm1d(6).double()(mine), whole):.2e} (rank 0's items)")
    ours = SyncBatchNorm(6).double()(mine)  # all-reduced statistics
    log("   " + check("SyncBatchNorm vs BatchNorm on the global batch", max_diff(ours, whole), TOL))
    try:  # torch's own, on CPU tensors in a group of k > 1 ranks
        nn.SyncBatchNorm(6).double()(mine)
    except ValueError as e:
        log(f"   torch.nn.SyncBatchNorm on CPU: {e}")
    model, start = GhostMLP(CURVE_HIDDEN), time.perf_counter()
    for _ in range(20):
        sgd_step(model, [(x[:64], y[:64])], LR)
    return (time.perf_counter() - start) / 20  # one step of batch 64 here: part 5's compute


def curve(step_s):
    try:
        rows, facts = read_csv("large_batch")
    except FileNotFoundError:
        return log("\n4-5. the curve is not measured here yet: python -m dist_sgd.bench "
                   "large_batch --save-figures")
    table, spans, fit, b_simple = summary(rows)
    batches = sorted({b for _, b in table})
    log(f"\n4. test accuracy (%), mean of the seeds, {facts.split(';')[0]} (figures/large_"
        "batch.csv)\n   " + "batch".rjust(13) + "".join(f"{b:>6d}" for b in batches) +
        "   within 1 point of batch 64")
    for recipe in ("none", "sqrt", "linear", "linear_warmup", "lars"):
        log(f"   {recipe:>13s}" + "".join(f"{table[recipe, b][0]:6.1f}" for b in batches) +
            f"   {spans[recipe][0]}-{spans[recipe][1]} ({width(spans[recipe]):.0f}x wide)")
    log("   Goyal, ResNet-50 top-1 error: " + ", ".join(f"{b}: {e}%" for b, e in GOYAL.items()) +
        "\n   (flat to 8k = 32x the base batch with warmup, then rising)")
    if fit is None:
        return log("   fewer than 2 batch sizes reached the target: no fit of S(B)")
    s_min, e_min = fit
    log(f"   steps to the target: S_min {s_min:.0f}, E_min {e_min:.0f}, B_crit "
        f"{e_min / s_min:.0f}; B_simple there (median over runs) {b_simple or float('nan'):.0f}")
    net = link(10, 20)  # a 10 Gbit/s network, 20 us a message: (alpha, beta)
    nbytes = 4 * sum(p.numel() for p in GhostMLP(CURVE_HIDDEN).parameters())
    log(f"\n5. time to the target: S(64 k) steps x a step (batch 64 computes {1e3 * step_s:.1f}"
        f" ms, a ring all-reduce of {nbytes / 1e3:.0f} kB at 10 Gbit/s)")
    times = {}
    for k in (2 ** i for i in range(11)):
        steps, step = s_min + e_min / (64 * k), predict_step(step_s, nbytes, k, "ring", *net)[0]
        times[k] = steps * step
        log(f"   {k:5d} workers: {steps:7.0f} steps x {1e3 * step:5.2f} ms = {times[k]:6.2f} s")
    last = next((k for k in times if 2 * k in times and times[2 * k] > 0.9 * times[k]), None)
    log(f"   past {last} workers doubling saves < 10%: the batch is past B_crit, the steps "
        "stop falling, and each step's all-reduce grows" if last else "")


if __name__ == "__main__":
    args = lesson_parser(__doc__, save_figures=True).parse_args()
    args.dataset = get_dataset("auto").name  # chosen once, here: every rank reads the same
    results = launch(run, args.world_size, args, backend=args.backend)
    if results is not None:
        curve(results[0])
