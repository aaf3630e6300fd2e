"""Figure 4: where a training step's time goes, for each way of syncing gradients.

Every rank keeps 32 samples (weak scaling). In one alternating run (time_alternating) we time
each strategy's full step (bench/steps.py) and, as one more candidate, the same step with
no communication at all: forward, loss, backward, SGD update. Every rank records its own
times, so for each sample we know each rank's compute time. Then, per strategy:

    compute        = median over samples of the ranks' mean compute time
    waiting        = median over samples of (slowest rank's compute - mean compute): the time
                     an average rank idles until the slowest one is ready to communicate
    communication  = step time (slowest rank) - compute - waiting: everything the strategy
                     adds on top of computing, i.e. the communication that is *not* hidden
                     behind backward (plus the wrapper's own overhead)

The three add up to the measured step. For average_gradients the time spent inside the call
is also recorded (column sync_call), as a cross-check of "communication + waiting"; the DDPs
communicate inside backward, overlapped, which is exactly why their bar is shorter.
"""
import statistics
import time

import torch
import torch.distributed as dist

from dist_sgd.bench import common
from dist_sgd.bench.scaling import DDP_BUCKET_MB, STRATEGIES
from dist_sgd.bench.steps import batch, build, make_steps
from dist_sgd.plumbing.figures import read_csv
from dist_sgd.plumbing.timing import summarize, time_alternating

NAME = "breakdown"
PARTS = (("compute", "tab:green"), ("waiting", "tab:gray"), ("communication", "tab:red"))


def settings(quick):
    if quick:
        return {"world_sizes": (2,), "models": ("net", "bignet"), "repeats": 3, "rank_batch": 16}
    return {"world_sizes": (2, 4), "models": ("net", "bignet"), "repeats": 9, "rank_batch": 32}


def _per_rank(values, world_size):
    """[[rank 0's values], [rank 1's], ...] from every rank's list (same length on all)."""
    mine = torch.tensor(values, dtype=torch.float64)
    everyone = [torch.empty_like(mine) for _ in range(world_size)]
    dist.all_gather(everyone, mine)
    return [t.tolist() for t in everyone]


def _worker(rank, world_size, s):
    rows, repeats = [], s["repeats"]
    for model_name in s["models"]:
        steps = make_steps(build(model_name), *batch(s["rank_batch"]),
                           STRATEGIES + ("single process",), DDP_BUCKET_MB)
        own = {name: [] for name in steps}

        def timed(fn, log):
            def run():
                start = time.perf_counter()
                fn()
                log.append(time.perf_counter() - start)
            return run
        samples = time_alternating({n: timed(f, own[n]) for n, f in steps.items()}, repeats, 1)
        compute = _per_rank(own["single process"][-repeats:], world_size)  # [rank][sample]
        mean = [statistics.fmean(c[i] for c in compute) for i in range(repeats)]
        skew = [max(c[i] for c in compute) - mean[i] for i in range(repeats)]
        for name in STRATEGIES:
            step = summarize(samples[name])
            call = _per_rank(steps[name].sync_seconds[-repeats:], world_size)
            c, w = statistics.median(mean), statistics.median(skew)
            rows.append({"model": model_name, "world_size": world_size, "strategy": name,
                         "rank_batch": s["rank_batch"], "step": step["median"],
                         "step_min": step["min"], "step_max": step["max"], "compute": c,
                         "waiting": w, "communication": max(0.0, step["median"] - c - w),
                         "sync_call": statistics.median(statistics.fmean(r[i] for r in call)
                                                        for i in range(repeats)),
                         "compute_alone_slowest": summarize(samples["single process"])["median"]})
    return rows


def measure(quick=False):
    s = settings(quick)
    return common.over_world_sizes(NAME, _worker, s["world_sizes"], s)


def report(rows):
    print(f"  {'model':7s} {'p':>2s} {'strategy':18s} {'step':>9s} {'compute':>9s} {'waiting':>9s} "
          f"{'comm':>9s} {'comm %':>7s}  (in average_gradients call)")
    for r in rows:
        print(f"  {r['model']:7s} {r['world_size']:2d} {r['strategy']:18s} "
              + " ".join(f"{r[k] * 1e3:7.1f}ms"
                         for k in ("step", "compute", "waiting", "communication"))
              + f" {r['communication'] / r['step']:7.0%}"
              + (f"  ({r['sync_call'] * 1e3:.1f} ms)"
                 if r["strategy"] == "average_gradients" else ""))


def draw():
    from dist_sgd.bench import plots  # matplotlib: only where we draw (ranks never need it)

    rows, facts = read_csv(NAME)
    model_names = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plots.figure(len(model_names), width=6.0, height=4.6)
    short = {"average_gradients": "average_\ngradients", "our DDP": "our DDP",
             "torch DDP": "torch DDP"}
    for ax, model_name in zip(axes[0], model_names):
        sel = [r for r in rows if r["model"] == model_name]
        labels, x = [], 0.0
        for p in sorted({r["world_size"] for r in sel}):
            for name in STRATEGIES:
                r = next(r for r in sel if r["world_size"] == p and r["strategy"] == name)
                bottom = 0.0
                for part, color in PARTS:
                    ax.bar(x, r[part] * 1e3, bottom=bottom, color=color, width=0.8)
                    bottom += r[part] * 1e3
                ax.errorbar(x, r["step"] * 1e3, yerr=[[(r["step"] - r["step_min"]) * 1e3],
                                                       [(r["step_max"] - r["step"]) * 1e3]],
                            fmt="none", ecolor="black", capsize=3)
                ax.annotate(f"{r['step'] * 1e3:.0f} ms\n{r['communication'] / r['step']:.0%} comm",
                             (x, bottom), xytext=(0, 3), textcoords="offset points",
                             ha="center", va="bottom", fontsize=7.5,
                             bbox={"fc": "white", "alpha": 0.8, "lw": 0, "pad": 1})
                labels.append((x, f"{short[name]}\np={p}"))
                x += 1
            x += 0.6
        ax.set_xticks([a for a, _ in labels], [b for _, b in labels], fontsize=8)
        ax.set_ylabel("time per step (ms)")
        ax.set_title(f"{model_name}, {sel[0]['rank_batch']} samples per rank", fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
    for ax in axes[0]:
        for part, color in PARTS:
            ax.bar([0], [0], color=color, label=part)
        ax.errorbar([], [], yerr=[], fmt="none", ecolor="black", capsize=3,
                    label="step time min-max")
        ax.legend(fontsize=8)
    return [plots.finish(
        fig, NAME, "Where a data-parallel step's time goes", facts,
        note="compute: the same step with no communication (mean over ranks); waiting: slowest "
             "rank's compute - mean; communication: measured step - compute - waiting "
             "(what is not hidden behind backward); medians")]
