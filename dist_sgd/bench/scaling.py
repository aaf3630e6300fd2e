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
import os

from dist_sgd.bench import common
from dist_sgd.bench.steps import batch, build, make_steps
from dist_sgd.plumbing.figures import read_csv
from dist_sgd.plumbing.timing import summarize, time_alternating
from dist_sgd.sgd import models

NAME = "scaling"
STRATEGIES = ("average_gradients", "our DDP", "torch DDP")
# The same bucket cap for both DDPs: at their defaults ours puts BigNet's 4.8 MB in one
# bucket (no overlap) while torch's starts with a 1 MiB bucket, an unfair comparison.
DDP_BUCKET_MB = 1.0


def settings(quick):
    if quick:
        return {"world_sizes": (1, 2), "models": ("net", "bignet"), "repeats": 3, "warmup": 1,
                "global_batch": 48, "rank_batch": 16}
    return {"world_sizes": (1, 2, 3, 4), "models": ("net", "bignet"), "repeats": 9, "warmup": 2,
            "global_batch": 96, "rank_batch": 32}  # 96: whole batches for 1, 2, 3 and 4 ranks


def _worker(rank, world_size, s):
    rows = []
    for model_name in s["models"]:
        model = build(model_name)
        for mode in ("strong", "weak"):
            size = s["global_batch"] // world_size if mode == "strong" else s["rank_batch"]
            names = STRATEGIES + (("single process",) if world_size == 1 else ())
            steps = make_steps(model, *batch(size), names, DDP_BUCKET_MB)
            samples = time_alternating(steps, s["repeats"], s["warmup"])
            for name, times in samples.items():
                t = summarize(times)
                rows.append({"model": model_name, "mode": mode, "strategy": name,
                             "world_size": world_size, "rank_batch": size,
                             "global_batch": size * world_size, "seconds": t["median"],
                             "min": t["min"], "max": t["max"], "n": t["n"],
                             "samples_per_s": size * world_size / t["median"],
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
    return common.over_world_sizes(NAME, _worker, s["world_sizes"], s, finish=efficiencies)


def report(rows):
    """Samples/s and efficiency at every world size measured, per model and mode."""
    for (model, mode) in dict.fromkeys((r["model"], r["mode"]) for r in rows):
        sel = [r for r in rows if r["model"] == model and r["mode"] == mode]
        base = next((r for r in sel if r["strategy"] == "single process"), None)
        print(f"  {model}, {mode} scaling" + (f" (one plain process: {base['samples_per_s']:.0f} "
                                              "samples/s)" if base else "")
              + ": samples/s (efficiency) per world size")
        print(f"    {'p':>2s} " + " ".join(f"{n:>20s}" for n in STRATEGIES))
        for p in sorted({r["world_size"] for r in sel}):
            cells = {r["strategy"]: f"{r['samples_per_s']:8.0f} ({r['efficiency']:6.1%})"
                     for r in sel if r["world_size"] == p}
            print(f"    {p:2d} " + " ".join(f"{cells.get(n, '-'):>20s}" for n in STRATEGIES))


MARKERS = {"average_gradients": ("o", "-"), "our DDP": ("s", "--"), "torch DDP": ("^", ":")}


def draw():
    from dist_sgd.bench import plots  # matplotlib: only where we draw (ranks never need it)

    rows, facts = read_csv(NAME)
    cores = rows[0]["cores"]
    model_names = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plots.figure(4, len(model_names), width=4.4, height=4.0)
    for i, model_name in enumerate(model_names):
        for j, (mode, what) in enumerate([(m, w) for m in ("strong", "weak")
                                          for w in ("samples_per_s", "efficiency")]):
            ax = axes[i][j]
            sel = [r for r in rows if r["model"] == model_name and r["mode"] == mode]
            ps = sorted({r["world_size"] for r in sel})
            base = next(r for r in sel if r["strategy"] == "single process")
            for k, name in enumerate(STRATEGIES):
                pts = sorted((r for r in sel if r["strategy"] == name),
                             key=lambda r: r["world_size"])
                # side by side: the three strategies often measure alike and would hide each other
                x = [r["world_size"] + 0.08 * (k - 1) for r in pts]
                if what == "samples_per_s":
                    y = [r["samples_per_s"] for r in pts]
                    lo = [r["global_batch"] / r["max"] for r in pts]
                    hi = [r["global_batch"] / r["min"] for r in pts]
                else:
                    y = [r["efficiency"] for r in pts]
                    lo = [r["efficiency"] * r["seconds"] / r["max"] for r in pts]
                    hi = [r["efficiency"] * r["seconds"] / r["min"] for r in pts]
                marker, ls = MARKERS[name]
                ax.errorbar(x, y, yerr=[[a - b for a, b in zip(y, lo)],
                                        [b - a for a, b in zip(y, hi)]],
                            marker=marker, ls=ls, capsize=3, ms=5, color=plots.COLORS[name],
                            label=name, alpha=0.9)
            ax.plot(1, base[what], "*", color="black", ms=12, zorder=5,
                    label="one process, no communication")
            if what == "samples_per_s":
                ax.plot(ps, [base["samples_per_s"] * p for p in ps], "k--", lw=0.8,
                        label="ideal: p x one process")
                ax.set_ylabel("samples / s (all ranks)")
            else:
                ax.axhline(1.0, color="k", ls="--", lw=0.8, label="ideal")
                ax.set_ylabel("parallel efficiency (1 = ideal)")
                ax.set_ylim(0, max(1.15, max(r["efficiency"] for r in sel) * 1.1))
            if ps[-1] > cores:
                ax.axvspan(cores + 0.5, ps[-1] + 0.5, color="gray", alpha=0.15, hatch="//",
                           label=f"oversubscribed (> {cores} cores)")
            ax.set_xticks(ps)
            ax.set_xlim(0.5, ps[-1] + 0.5)
            ax.set_xlabel("world size (processes)")
            size = (f"global batch {base['global_batch']}" if mode == "strong"
                    else f"{base['rank_batch']} per rank")
            ax.set_title(f"{model_name} ({base['gradient_bytes'] / 1e6:.2f} MB grads): "
                         f"{mode}, {size}", fontsize=9.5)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=6.5, loc="best")
    return [plots.finish(
        fig, NAME, f"Data-parallel scaling with 1 thread per process on a {cores}-core CPU", facts,
        note="synthetic batches of MNIST shape (step time does not depend on pixel values); "
             "median step time, bars min-max, strategies drawn side by side at each world size; "
             "efficiency vs one plain process with no communication; shading: more processes "
             "than cores")]
