"""The timeline of one backward pass (lesson 07, figures/ddp_timeline.png): when each gradient
became ready and when each all-reduce ran, for the three steps of lesson 07 on BigNet.

Times are rank 0's clock (time.perf_counter) from the moment backward() is called.
DistributedDataParallel's and HookDDP's `.trace` record when each gradient's hook fired, when
each all-reduce was launched and when the backend reported it done (gloo's completion callback,
a little Python on gloo's thread: tracing itself costs a little); NaiveDDP has no hooks, so a
probe hook times its gradients. On a GPU these are the times work was *queued*, not run.
Part of `python -m dist_sgd.bench ddp` (dist_sgd/bench/ddp.py).
"""
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from dist_sgd.bench import common, plots
from dist_sgd.launch import device, launch, log


def timeline_rank(rank, world_size, s, trials=5):
    """Trace `trials` backward passes per strategy; keep the one of median length (one pass
    alone may catch a burst of load on a shared machine). Rows on rank 0, None elsewhere."""
    from dist_sgd.bench.ddp import make_step  # the speed runs' steps (imported late: a cycle)
    rows = []
    for kind, cap in (("after backward", None), ("hooks, per parameter", None),
                      ("ours", s["cap"])):
        step = make_step(kind, s["batch"], cap=cap)
        for _ in range(3):
            step()  # warm up
        wrapped = step.wrapped
        names = {p: n for n, p in wrapped.module.named_parameters()}
        runs = sorted((_trace_once(wrapped, names, kind, s["batch"], world_size)
                       for _ in range(trials)), key=lambda r: r[-1]["end_ms"])
        rows += runs[len(runs) // 2]
    return rows if rank == 0 else None


def _trace_once(wrapped, names, kind, batch, world_size):
    ready = []
    probes = [p.register_post_accumulate_grad_hook(
        lambda p: ready.append((names[p], time.perf_counter()))) for p in names]
    wrapped.trace = []
    loss = forward_loss(wrapped, batch)
    dist.barrier()  # both ranks start backward together
    t0 = time.perf_counter()
    loss.backward()
    t_back = time.perf_counter()
    if kind == "after backward":  # NaiveDDP has no hooks: its one all-reduce comes now
        wrapped.finish_gradient_synchronization()
        wrapped.trace = [{"event": "launch", "t": t_back, "bucket": "all, flat"},
                         {"event": "done", "t": time.perf_counter(), "bucket": "all, flat"}]
    t_end = time.perf_counter()
    for h in probes:
        h.remove()

    def row(what, label, start, end):
        return {"world_size": world_size, "strategy": kind, "what": what, "label": label,
                "start_ms": round(1e3 * (start - t0), 3), "end_ms": round(1e3 * (end - t0), 3)}
    # The wrappers' own hooks note each gradient first (before copying it anywhere); our probe
    # hooks run after them, so they time only NaiveDDP, which has no hooks of its own.
    hooks = [(e["param"], e["t"]) for e in wrapped.trace if e["event"] == "hook"]
    rows = [row("gradient ready", n, t, t) for n, t in (hooks or ready)]
    started = {}
    for e in wrapped.trace:
        key = str(e.get("bucket", e.get("param")))
        if e["event"] == "launch":
            started[key] = e["t"]
        elif e["event"] == "done":
            rows.append(row("all-reduce", key, started[key], e["t"]))
    return rows + [row("gradients synchronized", "", t_back, t_end)]


def forward_loss(wrapped, batch):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(batch, 1, 28, 28, generator=gen).to(device())
    y = torch.randint(0, 10, (batch,), generator=gen).to(device())
    return F.nll_loss(wrapped(x), y)


def measure_timeline(s):
    log("ddp_timeline: one backward pass of BigNet, world size 2, three strategies ...")
    return save_timeline(launch(timeline_rank, 2, s, backend="gloo")[0])


def save_timeline(rows):
    for kind in dict.fromkeys(r["strategy"] for r in rows):
        mine = [r for r in rows if r["strategy"] == kind]
        last_grad = max(r["start_ms"] for r in mine if r["what"] == "gradient ready")
        comm = [r for r in mine if r["what"] == "all-reduce"]
        end = next(r["end_ms"] for r in mine if r["what"] == "gradients synchronized")
        log(f"  {kind:22s}: last gradient at {last_grad:6.1f} ms, {len(comm):2d} all-reduce(s), "
            f"first started at {min(r['start_ms'] for r in comm):6.1f} ms, "
            f"synchronized at {end:6.1f} ms")
    common.write_csv("ddp_timeline", rows)
    return rows



def draw_timeline():
    rows, facts = common.read_csv("ddp_timeline")
    kinds = list(dict.fromkeys(r["strategy"] for r in rows))
    fig, axes = plots.figure(1, nrows=len(kinds), width=10, height=2.6)
    for ax, kind in zip(axes[:, 0], kinds):
        mine = [r for r in rows if r["strategy"] == kind]
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
        ax.set_title(f"{kind}: {len(comm)} all-reduce(s)", fontsize=10)
        ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    axes[-1, 0].set_xlabel("ms since backward() was called (rank 0)")
    return plots.finish(fig, "ddp_timeline",
                        f"One backward pass of BigNet, world size {rows[0]['world_size']}", facts,
                        "alternating shades: consecutive all-reduces (buckets or parameters)")
