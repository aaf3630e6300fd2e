"""Our DistributedDataParallel against torch's, measured side by side (lessons 07 and 09).

    python -m dist_sgd.bench ddp            # through the one entry point
    python -m dist_sgd.bench.ddp [--quick]  # this module alone

Three measurements, each on BigNet (1.2 M parameters, 4.8 MB of gradients) with random batches
of MNIST's shape (a step's time does not depend on pixel values), all strategies of one run
alternating (time_alternating: medians, slowest rank per sample):
  ddp_speed     step time at world sizes 2 and 4 of: no communication at all (a floor),
                average_gradients after backward (per parameter, and flat), per-parameter hooks
                (lesson 07 step 2), our DDP and torch DDP (same bucket caps), torch DDP with its
                own defaults; prints ours / torch and "after backward" / "overlapped".
  bucket_sweep  step time against bucket_cap_mb, ours and torch's, world size 2.
  ddp_timeline  one backward pass: when each gradient was ready, when each all-reduce ran, for
                the three steps of lesson 07 (code in bench/ddp_timeline.py).
Lesson 09's comparison (training curves, differences, memory) lives in bench/comparison.py.
"""
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from dist_sgd.bench import common, plots
from dist_sgd.bench.ddp_timeline import (draw_timeline, measure_timeline, save_timeline,
                                         timeline_rank)
from dist_sgd.ddp import DistributedDataParallel
from dist_sgd.ddp_steps import HookDDP, NaiveDDP
from dist_sgd.launch import device, launch, log
from dist_sgd.models import BigNet
from dist_sgd.timing import summarize, time_alternating

ONE_BUCKET = 1024.0  # MiB: what "one bucket" means for torch DDP, which has no None for it
SWEEP_CAPS = (0, 0.01, 1, 25, None)  # BigNet: 8, 3, 2, 1 and 1 buckets


def settings(quick):
    if quick:
        return {"world_sizes": (2,), "batch": 8, "repeats": 2, "warmup": 1,
                "caps": (0, None), "cap": 1.0}
    return {"world_sizes": (2, 4), "batch": 16, "repeats": 40, "warmup": 3,
            "caps": SWEEP_CAPS, "cap": 1.0}


def make_step(kind, batch, cap=25.0, seed=0):
    """A zero-argument training step of BigNet synchronized the `kind` way (every rank calls
    it with the same kind: they all build the same wrappers in the same order)."""
    torch.manual_seed(seed)
    model = BigNet().to(device())
    gen = torch.Generator().manual_seed(seed + dist.get_rank())
    x = torch.randn(batch, 1, 28, 28, generator=gen).to(device())
    y = torch.randint(0, 10, (batch,), generator=gen).to(device())
    wrapped = {"no communication": lambda: model,
               "after backward": lambda: NaiveDDP(model, flat=True),
               "after backward, per parameter": lambda: NaiveDDP(model),
               "hooks, per parameter": lambda: HookDDP(model),
               "ours": lambda: DistributedDataParallel(model, bucket_cap_mb=cap),
               "torch": lambda: _torch_ddp(model, ONE_BUCKET if cap is None else cap),
               "torch, its defaults": lambda: _torch_ddp(model, None)}[kind]()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    finish = getattr(wrapped, "finish_gradient_synchronization", lambda: None)

    def step():
        opt.zero_grad()
        F.nll_loss(wrapped(x), y).backward()
        finish()  # averages for "after backward"; a no-op for the others (done in backward)
        opt.step()
    step.wrapped = wrapped
    return step


def _torch_ddp(model, cap):
    ids = [device().index] if device().type == "cuda" else None
    return TorchDDP(model, device_ids=ids, bucket_cap_mb=cap)


# ---- ddp_speed ---------------------------------------------------------------------------

SPEED_KINDS = ("no communication", "after backward, per parameter", "after backward",
               "hooks, per parameter", "ours", "torch", "torch, its defaults")


def speed_rank(rank, world_size, s):
    steps = {}
    for kind in SPEED_KINDS:
        if kind in ("ours", "torch"):  # 25 MiB, and buckets small enough to overlap on BigNet
            for cap in (25.0, s["cap"]):
                steps[f"{kind}, {cap:g} MiB"] = make_step(kind, s["batch"], cap=cap)
        else:
            steps[kind] = make_step(kind, s["batch"])
    samples = time_alternating(steps, s["repeats"], s["warmup"])
    return {k: summarize(v) for k, v in samples.items()}


def measure_speed(s):
    results = {}
    for ws in s["world_sizes"]:
        log(f"ddp_speed: world size {ws}, BigNet, {s['batch']} samples per rank, "
            f"{s['repeats']} alternating repeats ...")
        results[ws] = launch(speed_rank, ws, s, backend="gloo")[0]
        print_speed(_speed_rows(ws, results[ws]), s["cap"])
    return save_speed(results, s, echo=False)


def _speed_rows(ws, result):
    return [{"world_size": ws, "strategy": kind, "median_ms": 1e3 * r["median"],
             "min_ms": 1e3 * r["min"], "max_ms": 1e3 * r["max"], "n": r["n"]}
            for kind, r in result.items()]


def save_speed(results, s, echo=True):
    rows = []
    for ws, result in results.items():
        rows += _speed_rows(ws, result)
        if echo:
            print_speed(rows[-len(result):], s["cap"])
    common.write_csv("ddp_speed", rows)
    return rows


def print_speed(rows, cap):
    t = {r["strategy"]: r["median_ms"] for r in rows}
    for r in rows:
        print(f"  {r['strategy']:32s} {r['median_ms']:8.2f} ms  "
              f"(min {r['min_ms']:.2f}, max {r['max_ms']:.2f}, n={r['n']})")
    small = f"{cap:g} MiB"
    for c in ("25 MiB", small):
        print(f"  ratio ours / torch DDP, {c:>7s} buckets: {t['ours, ' + c] / t['torch, ' + c]:.3f}"
              "  (goal <= 1.05)")
    print(f"  ratio ours {small} / torch DDP's defaults: "
          f"{t['ours, ' + small] / t['torch, its defaults']:.3f}")
    best = t["ours, " + small]  # the bucket size that splits BigNet: overlap is possible
    print(f"  after backward (flat) / ours {small}, overlapped: {t['after backward'] / best:.3f}"
          "  (> 1: overlapping pays)")
    comm = t["after backward"] - t["no communication"]
    print(f"  where the time goes: compute {t['no communication']:.1f} ms; the all-reduce after "
          f"backward adds {comm:.1f} ms; ours adds {best - t['no communication']:.1f} ms "
          f"(hides {100 * (1 - (best - t['no communication']) / comm) if comm > 0 else 0:.0f}%)",
          flush=True)


# ---- bucket_sweep --------------------------------------------------------------------------

def sweep_rank(rank, world_size, s):
    steps, buckets = {}, {}
    for cap in s["caps"]:
        label = "one bucket" if cap is None else f"{cap:g}"
        steps[f"ours|{label}"] = make_step("ours", s["batch"], cap=cap)
        steps[f"torch|{label}"] = make_step("torch", s["batch"], cap=cap)
        buckets[label] = len(steps[f"ours|{label}"].wrapped.buckets)
    samples = time_alternating(steps, s["repeats"], s["warmup"])
    return {"world_size": world_size, "buckets": buckets,
            **{k: summarize(v) for k, v in samples.items()}}


def measure_sweep(s):
    log(f"bucket_sweep: caps {list(s['caps'])} MiB, ours and torch DDP, world size 2 ...")
    return save_sweep(launch(sweep_rank, 2, s, backend="gloo")[0])


def save_sweep(result):
    result = dict(result)
    rows, ws, buckets = [], result.pop("world_size"), result.pop("buckets")
    for key, r in result.items():
        who, label = key.split("|")
        rows.append({"world_size": ws, "who": who, "bucket_cap_mb": label,
                     "our_buckets": buckets[label],
                     "median_ms": 1e3 * r["median"],
                     "min_ms": 1e3 * r["min"], "max_ms": 1e3 * r["max"], "n": r["n"]})
    for label in dict.fromkeys(r["bucket_cap_mb"] for r in rows):
        o, t = (next(r for r in rows if r["who"] == w and r["bucket_cap_mb"] == label)
                for w in ("ours", "torch"))
        cap = label if label == "one bucket" else f"{label} MiB"
        log(f"  {cap:>14s} ({o['our_buckets']} buckets): ours {o['median_ms']:7.2f} ms, "
            f"torch {t['median_ms']:7.2f} ms, ratio {o['median_ms'] / t['median_ms']:.3f}")
    common.write_csv("bucket_sweep", rows)
    return rows


# ---- the entry points ------------------------------------------------------------------------

def measure(quick=False, parts=("speed", "sweep", "timeline")):
    s = settings(quick)
    if quick and set(parts) == {"speed", "sweep", "timeline"}:  # one spawn for all three
        log("ddp (quick): speed, bucket sweep and timeline in one group of 2 ranks ...")
        speed, sweep, timeline = launch(_quick_rank, 2, s, backend="gloo")[0]
        save_speed({2: speed}, s), save_sweep(sweep), save_timeline(timeline)
        return
    for part in parts:
        {"speed": measure_speed, "sweep": measure_sweep, "timeline": measure_timeline}[part](s)


def _quick_rank(rank, world_size, s):
    return (speed_rank(rank, world_size, s), sweep_rank(rank, world_size, s),
            timeline_rank(rank, world_size, s))


def draw(parts=("speed", "sweep", "timeline")):
    return [{"speed": draw_speed, "sweep": draw_sweep, "timeline": draw_timeline}[p]()
            for p in parts]


def draw_speed():
    rows, facts = common.read_csv("ddp_speed")
    sizes = sorted({r["world_size"] for r in rows})
    fig, axes = plots.figure(len(sizes), width=6.4)
    for ax, ws in zip(axes[0], sizes):
        mine = [r for r in rows if r["world_size"] == ws]
        y = range(len(mine))
        ax.barh(y, [r["median_ms"] for r in mine],
                xerr=[[r["median_ms"] - r["min_ms"] for r in mine],
                      [r["max_ms"] - r["median_ms"] for r in mine]],
                color=[_color(r["strategy"]) for r in mine], capsize=3)
        ax.set_yticks(list(y), [r["strategy"] for r in mine])
        ax.invert_yaxis()
        ax.set_xlabel("step time, ms (median; bars: min-max)")
        ax.set_title(f"world size {ws}" + (" (oversubscribed)" if ws > 2 else ""))
    return plots.finish(fig, "ddp_speed", "BigNet step time: our DDP vs torch DDP", facts,
                        "25 MiB unless stated; 'its defaults' = torch's 1 MiB first bucket")


def _color(strategy):
    if strategy.startswith("ours"):
        return plots.COLORS["our DDP"]
    if strategy.startswith("torch"):
        return plots.COLORS["torch DDP"]
    return "tab:green" if strategy == "no communication" else plots.COLORS["average_gradients"]


def draw_sweep():
    rows, facts = common.read_csv("bucket_sweep")
    labels = list(dict.fromkeys(str(r["bucket_cap_mb"]) for r in rows))
    fig, axes = plots.figure(1, width=7)
    ax = axes[0][0]
    for shift, (who, name) in ((-0.06, ("ours", "our DDP")), (0.06, ("torch", "torch DDP"))):
        mine = [next(r for r in rows if r["who"] == who and str(r["bucket_cap_mb"]) == lab)
                for lab in labels]
        med = [r["median_ms"] for r in mine]
        ax.errorbar([i + shift for i in range(len(labels))], med, marker="o", label=name,
                    color=plots.COLORS[name],
                    yerr=[[m - r["min_ms"] for m, r in zip(med, mine)],
                          [r["max_ms"] - m for m, r in zip(med, mine)]], capsize=3)
    counts = {str(r["bucket_cap_mb"]): r["our_buckets"] for r in rows}
    ax.set_xticks(range(len(labels)), [f"{lab}\n({counts[lab]} bucket{'s' * (counts[lab] > 1)})"
                                       for lab in labels])
    ax.set_xlabel("bucket_cap_mb (MiB)")
    ax.set_ylabel("step time, ms (median, min-max)")
    ax.legend()
    return plots.finish(fig, "bucket_sweep",
                        f"BigNet, world size {rows[0]['world_size']}: step time vs bucket size",
                        facts, "torch DDP has no 'one bucket' setting: 1024 MiB stands in")


def main(argv=None):
    """`python -m dist_sgd.bench.ddp [--quick]` is `python -m dist_sgd.bench ddp [--quick]`."""
    from dist_sgd.bench.__main__ import main as bench_main

    return bench_main(["ddp", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    main()
