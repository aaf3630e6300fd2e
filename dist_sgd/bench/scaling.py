"""Figure 3: samples per second and parallel efficiency vs world size, strong and weak scaling.

Three ways to keep replicas equal, all over gloo's torch.distributed.all_reduce so that only
the strategy differs: hand-written average_gradients after backward (one all-reduce per
parameter, the tutorial's way), our DistributedDataParallel (buckets, overlapped with
backward) and torch's. Each step is forward, nll loss, backward, gradient sync, SGD update.

    strong scaling: the global batch is fixed (96); each of p ranks gets 96 / p samples.
    weak scaling:   each rank keeps 32 samples; the global batch grows to 32 p.
    efficiency:     samples/s at p ranks / (p * samples/s of one plain process, no
                    communication, with the same per-rank batch as p = 1 of that mode)

The batches are random tensors of MNIST's shape: a step's time does not depend on the
pixel values, and no dataset has to be read. Ranks beyond the core count share cores: there
the processes take turns on the CPU, so no speed-up is possible (marked "oversubscribed").
"""
import copy
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from dist_sgd import models
from dist_sgd.bench import common, sweep
from dist_sgd.timing import summarize, time_alternating

NAME = "scaling"
STRATEGIES = ("average_gradients", "our DDP", "torch DDP")
GLOBAL_BATCH = 96  # divisible by 1, 2, 3 and 4: every world size gets the same whole batches
RANK_BATCH = 32


def settings(quick):
    if quick:
        return {"world_sizes": (1, 2), "models": ("net", "bignet"), "repeats": 3, "warmup": 1,
                "global_batch": 48, "rank_batch": 16}
    return {"world_sizes": (1, 2, 3, 4), "models": ("net", "bignet"), "repeats": 9, "warmup": 2,
            "global_batch": GLOBAL_BATCH, "rank_batch": RANK_BATCH}


DDP_BUCKET_MB = 1.0  # both DDPs, see make_steps


def make_steps(model, batch, strategies, seed=0, sync_times=None):
    """{strategy: zero-argument training step} on private copies of `model`, same batch.

    sync_times: optional {strategy: list}; each step appends the seconds spent in its explicit
    gradient-sync call (average_gradients; for the DDPs, what is left after backward).
    """
    from dist_sgd.ddp import DistributedDataParallel
    from dist_sgd.sync import average_gradients

    gen = torch.Generator().manual_seed(seed + (dist.get_rank() if dist.is_initialized() else 0))
    x = torch.randn(batch, 1, 28, 28, generator=gen)
    y = torch.randint(0, 10, (batch,), generator=gen)
    steps = {}
    for name in strategies:
        local = copy.deepcopy(model)
        # The same bucket cap for both DDPs: at their defaults ours puts BigNet's 4.8 MB in one
        # bucket (no overlap) while torch's starts with a 1 MiB bucket, an unfair comparison.
        if name == "our DDP":
            wrapped = DistributedDataParallel(local, bucket_cap_mb=DDP_BUCKET_MB)
        elif name == "torch DDP":
            wrapped = torch.nn.parallel.DistributedDataParallel(local, bucket_cap_mb=DDP_BUCKET_MB)
        else:
            wrapped = local
        opt = torch.optim.SGD(wrapped.parameters(), lr=0.01)

        def step(name=name, m=wrapped, opt=opt):
            opt.zero_grad()
            F.nll_loss(m(x), y).backward()
            start = time.perf_counter()
            if name == "average_gradients":
                average_gradients(m)
            elif name == "our DDP":
                m.finish_gradient_synchronization()  # already done by backward; idempotent
            if sync_times is not None:
                sync_times.setdefault(name, []).append(time.perf_counter() - start)
            opt.step()
        steps[name] = step
    return steps


def build(model_name):
    torch.manual_seed(0)
    model = models.MODELS[model_name]()
    model.apply(models.init_weights)
    return model


def _worker(rank, world_size, s):
    rows = []
    for model_name in s["models"]:
        model = build(model_name)
        for mode in ("strong", "weak"):
            batch = s["global_batch"] // world_size if mode == "strong" else s["rank_batch"]
            names = STRATEGIES + (("single process",) if world_size == 1 else ())
            samples = time_alternating(make_steps(model, batch, names), s["repeats"], s["warmup"])
            for name, times in samples.items():
                t = summarize(times)
                rows.append({"model": model_name, "mode": mode, "strategy": name,
                             "world_size": world_size, "rank_batch": batch,
                             "global_batch": batch * world_size, "seconds": t["median"],
                             "min": t["min"], "max": t["max"], "n": t["n"],
                             "samples_per_s": batch * world_size / t["median"],
                             "gradient_bytes": 4 * models.count_parameters(model),
                             "cores": os.cpu_count()})
    return rows


def efficiencies(rows):
    """Add each row's efficiency: samples/s / (p * samples/s of one plain process)."""
    base = {(r["model"], r["mode"]): r["samples_per_s"] for r in rows
            if r["strategy"] == "single process"}
    for r in rows:
        one = base.get((r["model"], r["mode"]))
        r["efficiency"] = r["samples_per_s"] / (r["world_size"] * one) if one else float("nan")
    return rows


def measure(quick=False):
    s = settings(quick)
    sweep.over_world_sizes(NAME, _worker, s["world_sizes"], s, finish=efficiencies)


def report(rows):
    for r in rows:
        if r["world_size"] == max(x["world_size"] for x in rows) or r["strategy"] == "single process":
            print(f"  {r['model']:7s} {r['mode']:6s} p={r['world_size']} {r['strategy']:18s} "
                  f"batch {r['rank_batch']:3d}/rank  {r['seconds'] * 1e3:8.1f} ms/step  "
                  f"{r['samples_per_s']:8.1f} samples/s  efficiency {r['efficiency']:6.1%}")


def draw():
    from dist_sgd.bench import plots  # matplotlib: only where we draw (ranks never need it)

    rows, facts = common.read_csv(NAME)
    report(rows)
    cores = rows[0]["cores"]
    model_names = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plots.figure(4, len(model_names), width=4.3, height=3.9)
    for i, model_name in enumerate(model_names):
        for j, (mode, what) in enumerate([(m, w) for m in ("strong", "weak")
                                          for w in ("samples_per_s", "efficiency")]):
            ax = axes[i][j]
            sel = [r for r in rows if r["model"] == model_name and r["mode"] == mode]
            ps = sorted({r["world_size"] for r in sel})
            base = next(r for r in sel if r["strategy"] == "single process")
            for name in STRATEGIES:
                pts = sorted((r for r in sel if r["strategy"] == name), key=lambda r: r["world_size"])
                x = [r["world_size"] for r in pts]
                if what == "samples_per_s":
                    y = [r["samples_per_s"] for r in pts]
                    lo = [r["global_batch"] / r["max"] for r in pts]
                    hi = [r["global_batch"] / r["min"] for r in pts]
                else:
                    y = [r["efficiency"] for r in pts]
                    lo = [r["efficiency"] * r["seconds"] / r["max"] for r in pts]
                    hi = [r["efficiency"] * r["seconds"] / r["min"] for r in pts]
                ax.errorbar(x, y, yerr=[[a - b for a, b in zip(y, lo)], [b - a for a, b in zip(y, hi)]],
                            marker="o", capsize=3, color=plots.COLORS[name], label=name)
                for xx, yy in zip(x, y):  # hatched (hollow) markers where ranks > cores
                    if xx > cores:
                        ax.plot(xx, yy, "o", ms=11, mfc="none", mec=plots.COLORS[name])
            ax.plot(1, base[what], "*", color="black", ms=12, zorder=5,
                    label="single process (no communication)")
            if what == "samples_per_s":
                ax.plot(ps, [base["samples_per_s"] * p for p in ps], "k--", lw=1,
                        label="ideal: p x one process")
                ax.set_ylabel("samples / s")
            else:
                ax.axhline(1.0, color="k", ls="--", lw=1, label="ideal")
                ax.set_ylabel("parallel efficiency")
                ax.set_ylim(0, max(1.15, max(r["efficiency"] for r in sel) * 1.1))
            if ps[-1] > cores:
                ax.axvspan(cores + 0.5, ps[-1] + 0.5, color="gray", alpha=0.15, hatch="//",
                           label=f"oversubscribed (> {cores} cores)")
            ax.set_xticks(ps)
            ax.set_xlim(0.5, ps[-1] + 0.5)
            ax.set_xlabel("world size (processes)")
            batch = (f"global batch {base['global_batch']}" if mode == "strong"
                     else f"{base['rank_batch']} per rank")
            ax.set_title(f"{model_name} ({base['gradient_bytes'] / 1e6:.2f} MB grads): "
                         f"{mode}, {batch}", fontsize=9.5)
            ax.grid(True, alpha=0.3)
    axes[0][0].legend(fontsize=7.5)
    path = plots.finish(
        fig, NAME, f"Data-parallel scaling with 1 thread per process on a {cores}-core CPU", facts,
        note="synthetic batches of MNIST shape (step time does not depend on pixel values); "
             "median step time, bars min-max; efficiency vs one plain process with no "
             "communication; hollow rings and shading: more processes than cores")
    return [path]
