"""Our DistributedDataParallel against torch's, and the steps of lesson 07, measured side by side.

Three measurements on BigNet (1.2 M parameters, 4.8 MB of gradients), steps from bench/steps.py,
all strategies of one run alternating (time_alternating: medians, slowest rank per sample):
  ddp_speed     step time at world sizes 2 and 4: single process (each rank alone, no
                communication: the floor), average_gradients (per parameter, and flat),
                per-parameter hooks, our DDP and torch DDP at the same bucket caps, torch DDP
                at its own defaults.
  bucket_sweep  step time against bucket_cap_mb, ours and torch's, world size 2.
  ddp_timeline  one backward pass: when each gradient was ready and when each all-reduce ran,
                for lesson 07's three steps. Times are rank 0's clock from the call to
                backward(); the wrappers' .trace records hook, launch and done (gloo's
                completion callback, a little Python on gloo's thread); the flat
                average_gradients has no hooks, so probe hooks time its gradients.
"""
import time

import torch.distributed as dist

from dist_sgd.bench import common
from dist_sgd.bench.steps import DEFAULTS, batch, build, make_step
from dist_sgd.plumbing.figures import read_csv, write_csv
from dist_sgd.plumbing.launch import launch
from dist_sgd.plumbing.timing import summarize, time_alternating

SWEEP_CAPS = (0, 0.01, 1, 25, None)  # BigNet, rebuilt: 8, 3, 2, 1, 1 buckets; None = one bucket
SPEED = ("single process", "average_gradients", "average_gradients, flat", "per-parameter hooks")
TIMELINE = ("average_gradients, flat", "per-parameter hooks", "our DDP")


def settings(quick):
    if quick:
        return {"world_sizes": (2,), "batch": 8, "repeats": 2, "warmup": 1, "caps": (0, None),
                "cap": 1.0}
    return {"world_sizes": (2, 4), "batch": 16, "repeats": 40, "warmup": 3, "caps": SWEEP_CAPS,
            "cap": 1.0}


def _label(cap):
    return "one bucket" if cap is None else f"{cap:g} MiB"


def speed_rank(rank, world_size, s):
    model, (x, y) = build("bignet"), batch(s["batch"])
    steps = {name: make_step(name, model, x, y) for name in SPEED}
    for name in ("our DDP", "torch DDP"):  # 25 MiB, and buckets small enough to overlap
        for cap in (25.0, s["cap"]):
            steps[f"{name}, {_label(cap)}"] = make_step(name, model, x, y, cap)
    steps["torch DDP, its defaults"] = make_step("torch DDP", model, x, y, DEFAULTS)
    samples = time_alternating(steps, s["repeats"], s["warmup"])
    return [{"world_size": world_size, "strategy": k, **_ms(v)} for k, v in samples.items()]


def sweep_rank(rank, world_size, s):
    model, (x, y) = build("bignet"), batch(s["batch"])
    steps = {}
    for cap in s["caps"]:
        for who in ("our DDP", "torch DDP"):
            steps[(who, cap)] = make_step(who, model, x, y, cap)
    samples = time_alternating(steps, s["repeats"], s["warmup"])
    # counted after the first backward, which rebuilt the buckets (before it: one bucket)
    buckets = {cap: len(steps[("our DDP", cap)].wrapped.buckets) for cap in s["caps"]}
    return [{"world_size": world_size, "who": who, "bucket_cap_mb": _label(cap).replace(" MiB", ""),
             "our_buckets": buckets[cap], **_ms(v)} for (who, cap), v in samples.items()]


def _ms(samples):
    t = summarize(samples)
    return {"median_ms": 1e3 * t["median"], "min_ms": 1e3 * t["min"], "max_ms": 1e3 * t["max"],
            "n": t["n"]}


def timeline_rank(rank, world_size, s, trials=5):
    """Trace `trials` backward passes per strategy; keep the one of median length (one pass
    alone may catch a burst of load on a shared machine). Rows on every rank."""
    model, (x, y) = build("bignet"), batch(s["batch"])
    rows = []
    for name in TIMELINE:
        step = make_step(name, model, x, y, s["cap"])
        for _ in range(3):
            step()  # warm up
        runs = sorted((_trace_once(step, name, world_size) for _ in range(trials)),
                      key=lambda r: r[-1]["end_ms"])
        rows += runs[len(runs) // 2]
    return rows


def _trace_once(step, name, world_size):
    wrapped = step.wrapped
    names = {p: n for n, p in wrapped.module.named_parameters()}
    ready = []
    probes = [p.register_post_accumulate_grad_hook(
        lambda p: ready.append((names[p], time.perf_counter()))) for p in names]
    wrapped.trace = []
    loss = step.loss()
    dist.barrier()  # both ranks start backward together
    t0 = time.perf_counter()
    loss.backward()
    t_back = time.perf_counter()
    wrapped.finish_gradient_synchronization()  # the flat average_gradients does all its work now
    t_end = time.perf_counter()
    for h in probes:
        h.remove()
    if name == "average_gradients, flat":
        wrapped.trace = [{"event": "launch", "t": t_back, "bucket": "all, flat"},
                         {"event": "done", "t": t_end, "bucket": "all, flat"}]

    def row(what, label, start, end):
        return {"world_size": world_size, "strategy": name, "what": what, "label": label,
                "start_ms": round(1e3 * (start - t0), 3), "end_ms": round(1e3 * (end - t0), 3)}
    # The wrappers' own hooks note each gradient first; the probes time the flat one only.
    hooks = [(e["param"], e["t"]) for e in wrapped.trace if e["event"] == "hook"]
    rows = [row("gradient ready", n, t, t) for n, t in (hooks or ready)]
    started = {}
    for e in wrapped.trace:
        key = str(e.get("bucket", e.get("param")))
        if e["event"] == "launch":
            started[key] = e["t"]
        elif e["event"] == "done":
            rows.append(row("all-reduce", key, started[key], e["t"]))
    wrapped.trace = None
    return rows + [row("gradients synchronized", "", t_back, t_end)]


def _all_parts(rank, world_size, s):
    return speed_rank(rank, world_size, s), sweep_rank(rank, world_size, s), \
        timeline_rank(rank, world_size, s)


def measure(quick=False):
    """{"ddp_speed": rows, "bucket_sweep": rows, "ddp_timeline": rows}, each also a CSV."""
    s = settings(quick)
    if quick:  # one spawn for all three
        speed, sweep, timeline = launch(_all_parts, 2, s, backend="gloo")[0]
    else:
        speed = common.over_world_sizes("ddp_speed", speed_rank, s["world_sizes"], s)
        sweep = launch(sweep_rank, 2, s, backend="gloo")[0]
        timeline = launch(timeline_rank, 2, s, backend="gloo")[0]
    out = {"ddp_speed": speed, "bucket_sweep": sweep, "ddp_timeline": timeline}
    for name, rows in out.items():
        write_csv(name, rows)
    return out


def load():
    return {name: read_csv(name)[0] for name in ("ddp_speed", "bucket_sweep", "ddp_timeline")}


def report(out):
    for ws in sorted({r["world_size"] for r in out["ddp_speed"]}):
        rows = [r for r in out["ddp_speed"] if r["world_size"] == ws]
        t = {r["strategy"]: r["median_ms"] for r in rows}
        print(f"  world size {ws}: BigNet step time, median (min-max, samples)")
        for r in rows:
            print(f"    {r['strategy']:32s} {r['median_ms']:8.2f} ms  "
                  f"({r['min_ms']:.2f}-{r['max_ms']:.2f}, n={r['n']})")
        caps = [k.split(", ", 1)[1] for k in t if k.startswith("our DDP, ")]
        for cap in caps:
            print(f"    ours / torch DDP, {cap:>7s} buckets: "
                  f"{t['our DDP, ' + cap] / t['torch DDP, ' + cap]:.3f}")
        best = min(t["our DDP, " + c] for c in caps)
        comm = t["average_gradients, flat"] - t["single process"]
        print(f"    average_gradients, flat / our DDP's best: "
              f"{t['average_gradients, flat'] / best:.3f}  (> 1: overlapping pays); of the "
              f"{comm:.1f} ms the flat all-reduce adds, our DDP hides "
              f"{1 - (best - t['single process']) / comm if comm > 0 else 0:.0%}")
    for r in (r for r in out["bucket_sweep"] if r["who"] == "our DDP"):
        theirs = next(q for q in out["bucket_sweep"]
                      if q["who"] == "torch DDP" and q["bucket_cap_mb"] == r["bucket_cap_mb"])
        print(f"  bucket_cap_mb {r['bucket_cap_mb']!s:>10s} ({r['our_buckets']} buckets): ours "
              f"{r['median_ms']:7.2f} ms, torch {theirs['median_ms']:7.2f} ms, "
              f"ratio {r['median_ms'] / theirs['median_ms']:.3f}")
    for name in dict.fromkeys(r["strategy"] for r in out["ddp_timeline"]):
        mine = [r for r in out["ddp_timeline"] if r["strategy"] == name]
        comm = [r for r in mine if r["what"] == "all-reduce"]
        print(f"  timeline, {name:24s}: last gradient at "
              f"{max(r['start_ms'] for r in mine if r['what'] == 'gradient ready'):6.1f} ms, "
              f"{len(comm):2d} all-reduce(s), first started at "
              f"{min(r['start_ms'] for r in comm):6.1f} ms, synchronized at "
              f"{next(r['end_ms'] for r in mine if r['what'] == 'gradients synchronized'):6.1f} ms")


def draw():
    return [draw_speed(), draw_sweep(), draw_timeline()]


def draw_speed():
    from dist_sgd.bench import plots  # matplotlib: only where we draw (ranks never need it)

    rows, facts = read_csv("ddp_speed")
    sizes = sorted({r["world_size"] for r in rows})
    fig, axes = plots.figure(len(sizes), width=6.4)
    for ax, ws in zip(axes[0], sizes):
        mine = [r for r in rows if r["world_size"] == ws]
        y = range(len(mine))
        ax.barh(y, [r["median_ms"] for r in mine],
                xerr=[[r["median_ms"] - r["min_ms"] for r in mine],
                      [r["max_ms"] - r["median_ms"] for r in mine]],
                color=[plots.color(r["strategy"]) for r in mine], capsize=3)
        ax.set_yticks(list(y), [r["strategy"] for r in mine])
        ax.invert_yaxis()
        ax.set_xlabel("step time, ms (median; bars: min-max)")
        over = f" (oversubscribed: > {plots.cores(facts)} cores)" if ws > plots.cores(facts) else ""
        ax.set_title(f"world size {ws}{over}")
    return plots.finish(fig, "ddp_speed", "BigNet step time: our DDP vs torch DDP", facts,
                        "25 MiB unless stated; 'its defaults' = torch's 1 MiB first bucket")


def draw_sweep():
    from dist_sgd.bench import plots  # matplotlib: only where we draw (ranks never need it)

    rows, facts = read_csv("bucket_sweep")
    labels = list(dict.fromkeys(str(r["bucket_cap_mb"]) for r in rows))
    fig, axes = plots.figure(1, width=7)
    ax = axes[0][0]
    for shift, who in ((-0.06, "our DDP"), (0.06, "torch DDP")):
        mine = [next(r for r in rows if r["who"] == who and str(r["bucket_cap_mb"]) == lab)
                for lab in labels]
        med = [r["median_ms"] for r in mine]
        ax.errorbar([i + shift for i in range(len(labels))], med, marker="o", label=who,
                    color=plots.COLORS[who], capsize=3,
                    yerr=[[m - r["min_ms"] for m, r in zip(med, mine)],
                          [r["max_ms"] - m for m, r in zip(med, mine)]])
    counts = {str(r["bucket_cap_mb"]): r["our_buckets"] for r in rows}
    ax.set_xticks(range(len(labels)), [f"{lab}\n({counts[lab]} bucket{'s' * (counts[lab] > 1)})"
                                       for lab in labels])
    ax.set_xlabel("bucket_cap_mb (MiB)")
    ax.set_ylabel("step time, ms (median, min-max)")
    ax.legend()
    return plots.finish(fig, "bucket_sweep",
                        f"BigNet, world size {rows[0]['world_size']}: step time vs bucket size",
                        facts, "torch DDP has no 'one bucket' setting: 1024 MiB stands in")


def draw_timeline():
    from dist_sgd.bench import plots  # matplotlib: only where we draw (ranks never need it)

    rows, facts = read_csv("ddp_timeline")
    names = list(dict.fromkeys(r["strategy"] for r in rows))
    fig, axes = plots.figure(1, nrows=len(names), width=10, height=2.6)
    for ax, name in zip(axes[:, 0], names):
        mine = [r for r in rows if r["strategy"] == name]
        ready = [r for r in mine if r["what"] == "gradient ready"]
        ax.scatter([r["start_ms"] for r in ready], [1] * len(ready), marker="|", s=300,
                   color="tab:green", label="a gradient is ready (hook)")
        comm = [r for r in mine if r["what"] == "all-reduce"]
        for i, r in enumerate(comm):
            ax.barh(0, r["end_ms"] - r["start_ms"], left=r["start_ms"], height=0.5,
                    color=("tab:blue", "tab:cyan")[i % 2], edgecolor="k",
                    label="all-reduce in flight" if i == 0 else None)
        end = next(r["end_ms"] for r in mine if r["what"] == "gradients synchronized")
        ax.axvline(end, color="tab:red", ls="--", label=f"synchronized ({end:.1f} ms)")
        ax.set_yticks([0, 1], ["all-reduce", "backward"])
        ax.set_ylim(-0.6, 1.6)
        ax.set_xlim(left=0)
        ax.set_xlabel("ms since backward() was called (rank 0)")
        ax.set_title(f"{name}: {len(comm)} all-reduce(s)", fontsize=10)
        ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    return plots.finish(fig, "ddp_timeline",
                        f"One backward pass of BigNet, world size {rows[0]['world_size']}", facts,
                        "alternating shades: consecutive all-reduces (buckets or parameters)")
