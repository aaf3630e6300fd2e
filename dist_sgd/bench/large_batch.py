"""Lesson 18's figure: test accuracy against the global batch, five learning-rate recipes.

The same MLP with ghost BatchNorm, the same epochs and data; only the global batch B (32 to
8192) and the learning-rate recipe change (none, sqrt, linear, linear_warmup, lars), 2 seeds;
train_one() builds lesson 18's recipe at each size. Runs go two at a time (2 cores).
  -> large_batch.csv (one row per recipe, batch and seed), large_batch_noise.csv (B_simple
     over training), large_batch.png
What each recipe and column means: measure()'s docstring.
"""
import concurrent.futures
import math
import multiprocessing
import os
import time

import torch
import torch.nn.functional as F

from dist_sgd.large_batch.curve import RECIPES, summary, width
from dist_sgd.large_batch.ghostbn import GhostMLP
from dist_sgd.large_batch.lars import LARS
from dist_sgd.large_batch.noise import NoiseScale
from dist_sgd.plumbing.figures import figure_path, read_csv, write_csv
from dist_sgd.sgd.data import LABELS, get_dataset

NAME = "large_batch"
BASE_BATCH = RANK_BATCH = 64  # base_lr's batch, and each simulated rank's batch
BASE_LR, MOMENTUM, HIDDEN, WEIGHT_DECAY = 0.01, 0.9, 256, 0.0
# LARS's own base rate and trust coefficient: a step of lr x TRUST x |w| per layer (0.1% of
# |w| at batch 64); biases take lr x g
LARS_LR, TRUST = 0.05, 0.02
EPOCHS, WARMUP_EPOCHS = 8, 3
TARGET = {"fashion-mnist": 0.84, "mnist": 0.96, "synthetic": 0.5}
EVALS_PER_EPOCH, EVAL_ITEMS = 10, 2000
# noise-scale steps per epoch (each runs its 64-item micro-batches one by one: at B >= 2048
# more would double the run), averaged over about an epoch; items per forward
NOISE_PER_EPOCH, NOISE_DECAY, CHUNK = 5, 0.8, 1024
_DATA = {}


def settings(quick):
    if quick:
        return {"batches": (32, 64, 256, 1024), "seeds": (0,), "epochs": 2, "warmup": 0.75,
                "train_items": 6000, "recipes": RECIPES}
    return {"batches": tuple(2 ** i for i in range(5, 14)), "seeds": (0, 1), "epochs": EPOCHS,
            "warmup": WARMUP_EPOCHS, "train_items": None, "recipes": RECIPES}


def base_lr(recipe):
    return LARS_LR if recipe == "lars" else BASE_LR


def peak_lr(recipe, batch):
    k = batch / BASE_BATCH
    return base_lr(recipe) * {"none": 1.0, "sqrt": math.sqrt(k)}.get(recipe, k)


def _data(train_items):
    if train_items not in _DATA:
        train, test = get_dataset("auto", quiet=True), get_dataset("auto", train=False, quiet=True)
        x, y = train.tensors
        _DATA[train_items] = (train.name, x[:train_items], y[:train_items], *test.tensors)
    return _DATA[train_items]


def train_one(recipe, batch, seed, epochs, train_items=None, warmup_epochs=WARMUP_EPOCHS):
    """One run: a row for the CSV, and B_simple's trace."""
    torch.set_num_threads(1)
    name, x, y, test_x, test_y = _data(train_items)
    torch.manual_seed(seed)
    model = GhostMLP(HIDDEN, group=RANK_BATCH)
    params = list(model.parameters())
    lr = peak_lr(recipe, batch)
    steps_per_epoch = len(x) // batch
    total = epochs * steps_per_epoch
    warm = int(warmup_epochs * steps_per_epoch) if recipe in ("linear_warmup", "lars") and \
        batch > BASE_BATCH else 0
    if recipe == "lars":
        opt = LARS(params, lr, MOMENTUM, WEIGHT_DECAY, trust_coefficient=TRUST)
    else:
        opt = torch.optim.SGD(params, lr, MOMENTUM, weight_decay=WEIGHT_DECAY)
    decay = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total - warm)
    sched = decay if not warm else torch.optim.lr_scheduler.SequentialLR(opt, [
        torch.optim.lr_scheduler.LinearLR(opt, base_lr(recipe) / lr, 1.0, total_iters=warm), decay],
        milestones=[warm])
    noise, trace, reached, at_target = NoiseScale(NOISE_DECAY), [], None, ""
    every = max(1, steps_per_epoch // EVALS_PER_EPOCH)
    noise_every = max(1, steps_per_epoch // NOISE_PER_EPOCH)
    order_gen = torch.Generator().manual_seed(1000 + seed)
    start, step = time.perf_counter(), 0
    for epoch in range(epochs):
        order = torch.randperm(len(x), generator=order_gen)
        for s in range(steps_per_epoch):
            idx = order[s * batch:(s + 1) * batch]
            # Every noise_every-th step runs as k = B / 64 simulated ranks (micro-batches of
            # 64) to measure the noise scale; the others in chunks of up to CHUNK items: the
            # same gradient (accumulated, normalized by B), fewer Python steps.
            ranks = batch > RANK_BATCH and step % noise_every == 0
            micro = RANK_BATCH if ranks else min(batch, CHUNK)
            acc, small_sq = [torch.zeros_like(p) for p in params], 0.0
            for m in range(0, batch, micro):
                part = idx[m:m + micro]
                # normalized by the global batch (lesson 06's rule): the sum is the mean
                loss = F.nll_loss(model(x[part]), y[part], reduction="sum") / batch
                grads = torch.autograd.grad(loss, params)
                if ranks:  # this rank's own mean-loss gradient is (B / 64) g
                    small_sq += sum(float(g.square().sum()) for g in grads) * (batch / micro) ** 2
                for a, g in zip(acc, grads):
                    a.add_(g)
            for p, a in zip(params, acc):
                p.grad = a
            if ranks:  # |G_small|^2 averaged over the k ranks (batch 64); |G_big|^2 (batch B)
                noise.update(small_sq / (batch // micro),
                             sum(float(a.square().sum()) for a in acc), micro, batch)
            opt.step()
            sched.step()
            step += 1
            if step % every == 0 or step == total:
                with torch.no_grad():  # eval: BatchNorm's running statistics
                    model.eval()
                    correct = (model(test_x[:EVAL_ITEMS]).argmax(1) == test_y[:EVAL_ITEMS]).float()
                    model.train()
                if reached is None and correct.mean() >= TARGET[name]:
                    # B_simple grows as training goes on: the one that matters for the
                    # steps to this target (B_crit) is the one here
                    reached, at_target = step, noise.b_simple
                if batch > RANK_BATCH:
                    trace.append({"recipe": recipe, "batch": batch, "seed": seed, "step": step,
                                  "epoch": round(step / steps_per_epoch, 3),
                                  "b_simple": round(noise.b_simple, 1)})
        if not math.isfinite(loss.item()):
            break  # diverged: the rest would be NaN too
    model.eval()
    with torch.no_grad():
        accuracy = (model(test_x).argmax(1) == test_y).double().mean().item()
    return {"recipe": recipe, "batch": batch, "seed": seed,
            "test_accuracy": round(100 * accuracy, 2), "peak_lr": round(lr, 6),
            "epochs": epochs, "steps": total, "warmup_steps": warm,
            "steps_to_target": reached if reached is not None else "",
            "target": TARGET[name],
            "b_simple": round(at_target, 1) if batch > RANK_BATCH and at_target != "" else "",
            "b_simple_final": round(noise.b_simple, 1) if batch > RANK_BATCH else "",
            "seconds": round(time.perf_counter() - start, 1), "dataset": name}, trace


def measure(quick):
    """Every run of the curve: rows (and B_simple's traces) into the CSVs.

    The same model (an MLP with BatchNorm, 784-256-BN-ReLU-256-BN-ReLU-10), the same number of
    epochs (8), the same data (Fashion-MNIST where present, else MNIST; a synthetic stand-in only
    for --quick and tests, and said); only the global batch B (32 to 8192) and the learning-rate
    recipe change; 2 seeds. Each rank keeps its batch of 64: B = k x 64 is k simulated ranks, run
    as micro-batches accumulated in one process (lesson 18 proves that equal to k real ranks'
    average_gradients), and BatchNorm per simulated worker over its own 64 items, as Goyal's
    per-worker BatchNorm (ghost BatchNorm, dist_sgd/large_batch/ghostbn.py: a chunk of j x 64 items
    normalized in j groups of 64, the same as j workers each normalizing its own). BatchNorm is
    what lets the network take the large rates that linear scaling asks for. Recipes, from
    base_lr = BASE_LR at batch 64 with momentum 0.9 (LARS: LARS_LR):

        none            lr = base_lr at every batch
        sqrt            lr = base_lr x sqrt(B / 64)
        linear          lr = base_lr x B / 64 from the first step (Goyal's linear scaling rule)
        linear_warmup   the same peak, reached by Goyal's gradual warmup: from base_lr, rising every
                        iteration for WARMUP_EPOCHS epochs (none at B <= 64)
        lars            LARS (dist_sgd/large_batch/lars.py), linear scaling and the same warmup
    Every recipe then follows a cosine to 0 (torch's LinearLR, CosineAnnealingLR, SequentialLR).

    Along the way every run with k >= 2 estimates the gradient noise scale B_simple from the
    micro-batch gradients (batch 64) and their average (batch B), and the linear_warmup runs note
    the steps they needed to reach TARGET test accuracy (on 2,000 test images, checked 10 times an
    epoch): S(B), fitted to McCandlish's (S/S_min - 1)(E/E_min - 1) = 1 for B_crit = E_min / S_min,
    and B_simple at that moment (column b_simple; b_simple_final: at the end, when the gradient's
    signal has nearly vanished and the noise scale is far larger).
      -> large_batch.csv (one row per recipe, batch and seed), large_batch_noise.csv (B_simple over
         training), large_batch.png
    Runs go two at a time (the machine's 2 cores), one thread each: 90 runs, about 15 minutes on a
    quiet 2-core machine (the small batches take longest: more optimizer steps per epoch).
    """
    cfg = settings(quick)
    name = _data(cfg["train_items"])[0]
    print(f"  data: {LABELS[name]}" + ("" if name != "synthetic" else
          " (a synthetic stand-in: the curve means little on it)"), flush=True)
    jobs = [(r, b, s) for b in sorted(cfg["batches"]) for r in cfg["recipes"]
            for s in cfg["seeds"]]
    rows, traces, start = [], [], time.perf_counter()
    workers = min(2, os.cpu_count() or 1)
    with concurrent.futures.ProcessPoolExecutor(
            workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(train_one, r, b, s, cfg["epochs"], cfg["train_items"],
                               cfg["warmup"])
                   for r, b, s in jobs]
        for i, f in enumerate(concurrent.futures.as_completed(futures), 1):
            row, trace = f.result()
            rows.append(row)
            traces += trace
            print(f"  [{i}/{len(jobs)}] {row['recipe']:13s} batch {row['batch']:5d} seed "
                  f"{row['seed']}: {row['test_accuracy']:.2f}% ({row['seconds']:.0f} s; "
                  f"{time.perf_counter() - start:.0f} s so far)", flush=True)
    key = {r: i for i, r in enumerate(RECIPES)}
    rows.sort(key=lambda r: (key[r["recipe"]], r["batch"], r["seed"]))
    write_csv(NAME, rows, facts=f"{LABELS[name]}; MLP {HIDDEN}-{HIDDEN} hidden, "
              f"BatchNorm per {RANK_BATCH} items, {cfg['epochs']} epochs, "
              f"base lr {BASE_LR} at batch {BASE_BATCH}, momentum {MOMENTUM}; "
              f"{_facts()}")
    write_csv(NAME + "_noise", traces)
    return rows


def _facts():
    from dist_sgd.plumbing.figures import machine_facts
    return machine_facts()


def load():
    try:
        return read_csv(NAME)[0]
    except FileNotFoundError:
        print(f"  {NAME}: no {NAME}.csv yet (measure it first); nothing to report")
        return None


def report(rows):
    table, spans, fit, b_simple = summary(rows)
    batches = sorted({int(r["batch"]) for r in rows})
    print("  test accuracy (%), mean over seeds [min, max]:")
    print("  " + "batch".rjust(14) + "".join(f"{b:>8d}" for b in batches))
    for recipe in RECIPES:
        cells = [f"{table[recipe, b][0]:8.2f}" if (recipe, b) in table else " " * 8
                 for b in batches]
        print(f"  {recipe:>14s}" + "".join(cells))
    for recipe in RECIPES:
        span = spans[recipe]
        if span:
            print(f"  {recipe:13s} within 1 point of batch 64: batch {span[0]}-{span[1]} "
                  f"({width(span):.0f}x wide)")
    if spans.get("linear_warmup") and spans.get("linear") and spans.get("none"):
        w = width(spans["linear_warmup"])
        print(f"  linear_warmup's range is {w / width(spans['linear']):.0f}x linear's and "
              f"{w / width(spans['none']):.0f}x none's")
    if fit:
        s_min, e_min = fit
        print(f"  steps to the target (linear_warmup): S_min {s_min:.0f}, E_min {e_min:.0f}, "
              f"B_crit = E_min / S_min = {e_min / s_min:.0f}")
    if b_simple:
        print(f"  gradient noise scale B_simple (median of linear_warmup's runs) {b_simple:.0f}")


def draw():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    try:
        rows, facts = read_csv(NAME)
    except FileNotFoundError:
        return []
    table, spans, fit, b_simple = summary(rows)
    fig, (ax, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4.5))
    for recipe in RECIPES:
        bs = sorted(b for r, b in table if r == recipe)
        mean = [table[recipe, b][0] for b in bs]
        err = [[m - table[recipe, b][1] for m, b in zip(mean, bs)],
               [table[recipe, b][2] - m for m, b in zip(mean, bs)]]
        ax.errorbar(bs, mean, yerr=err, marker="o", capsize=3, label=recipe)
    top = max(v[0] for v in table.values())
    if b_simple:
        ax.axvline(b_simple, color="gray", ls="--", label=f"B_simple ~ {b_simple:.0f}")
    if fit:
        ax.axvline(fit[1] / fit[0], color="gray", ls=":", label=f"B_crit ~ {fit[1] / fit[0]:.0f}")
    ax.set(xscale="log", xlabel="global batch", ylabel="test accuracy (%)",
           ylim=(max(0, top - 25), top + 2), title="same epochs, bigger batch")
    ax.set_xscale("log", base=2)
    ax.legend(fontsize=8)
    warm = [r for r in rows if r["recipe"] == "linear_warmup" and r["steps_to_target"] != ""]
    if not warm:
        ax2.text(0.5, 0.5, "no linear_warmup run reached the target", ha="center",
                 transform=ax2.transAxes)
    else:
        ax2.plot([r["batch"] for r in warm], [r["steps_to_target"] for r in warm], "o",
                 label="linear_warmup runs")
        if fit:
            grid = sorted({int(r["batch"]) for r in warm})
            ax2.plot(grid, [fit[0] + fit[1] / b for b in grid], "-",
                     label=f"S_min + E_min / B: S_min {fit[0]:.0f}, E_min {fit[1]:.0f}")
        ax2.set(xscale="log", yscale="log", xlabel="global batch",
                ylabel=f"steps to {100 * warm[0]['target']:.0f}% test accuracy",
                title="steps to a target")
        ax2.set_xscale("log", base=2)
        ax2.legend(fontsize=8)
    try:
        noise = read_csv(NAME + "_noise")[0]
    except FileNotFoundError:
        noise = []
    for batch in sorted({r["batch"] for r in noise if r["recipe"] == "linear_warmup"}):
        pts = [r for r in noise if r["batch"] == batch and r["seed"] == 0 and
               r["recipe"] == "linear_warmup" and 0 < float(r["b_simple"]) < math.inf]
        ax3.plot([r["epoch"] for r in pts], [r["b_simple"] for r in pts], label=f"B = {batch}")
    ax3.set(xlabel="epoch", ylabel="B_simple (moving average)", yscale="log",
            title="gradient noise scale during training")
    if noise:
        ax3.legend(fontsize=7, ncol=2)
    fig.suptitle(facts.split(";")[0], fontsize=9)
    fig.tight_layout()
    path = figure_path(NAME + ".png")
    fig.savefig(path, dpi=110)
    return [path]
