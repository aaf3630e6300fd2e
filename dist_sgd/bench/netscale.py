"""All-reduce at scale: 2, 4, 8 and 16 emulated nodes on a link that is the bottleneck.

    sudo python3 -m dist_sgd.bench netscale      # needs root (network namespaces); ~15 min

On one machine every rank shares the CPUs that copy its bytes, so collectives show the
machine, not the algorithm. Here every node is a network namespace with a 100 Mbit/s link
each way (dist_sgd.scale.cluster's SCALING_RATE), slow enough that 16 nodes on 2 cores stay
link-bound for big messages. For each node count p a fresh cluster runs, in every node,
`python -m dist_sgd.bench.netscale --node OUT` (one rank per node), which

  1. checks every all-reduce (gloo's and our naive, tree, ring, halving-doubling) against the
     single-machine sum, at an odd size (uneven chunks);
  2. plays ping-pong between nodes 0 and 1 (64 B - 16 MiB with 2 nodes, a few sizes else);
     with 2 nodes it also measures what a message costs the CPU (p2p.exchange_cpu: the busy
     time of every core while two ranks swap messages, per message, at three sizes);
  3. times the five all-reduces at 1 KiB - 16 MiB, alternated at each size (medians); naive
     apart, after the others (its incast slows whatever runs right after it).

The alpha-beta fit and its two predictions of every point: report()'s docstring.
"""
import os
import sys

import torch
import torch.distributed as dist

from dist_sgd.bench import nodes
from dist_sgd.bench.common import measured_as_root
from dist_sgd.plumbing.figures import machine_facts, write_csv
from dist_sgd.plumbing.timing import summarize, time_alternating
from dist_sgd.scale import cluster, costmodel, netns
from dist_sgd.scale.summaries import (crossover_words, netscale_fit, netscale_summary,
                                      netscale_table, netscale_with_model)

NAME = "netscale"
KiB, MiB = 2 ** 10, 2 ** 20
ALGORITHMS = ("gloo", "ring", "halving_doubling", "tree", "naive")
RATE = cluster.SCALING_RATE
TOLERANCE = {"gloo": 0.10, "ring": 0.10, "halving_doubling": 0.10, "tree": 0.20, "naive": 0.20}
CAPS = {("naive", 8): 4 * MiB, ("naive", 16): 4 * MiB}  # the largest size timed


def settings(quick):
    if quick:
        return {"nodes": (2, 4), "sizes": (4 * KiB, 64 * KiB, 1 * MiB),
                "pp": {2: costmodel.shaped_link_sizes(quick=True), "other": (KiB, MiB)},
                "cpu": ((64, 64 * KiB), 0.2, 1), "repeats": lambda n: 2}
    return {"nodes": (2, 4, 8, 16), "sizes": tuple(4 ** k * KiB for k in range(8)),
            # the fit's ping-pong in the 2-node cluster, 1 KiB .. 16 MiB; elsewhere a check
            # that the links are the same
            "pp": {2: (64,) + tuple(4 ** k * KiB for k in range(8)), "other": (KiB, 64 * KiB, MiB)},
            # CPU seconds per message: ~1 s of swaps per size, three rounds (medians), with 2
            # nodes only
            "cpu": ((64, 64 * KiB, MiB), 1.0, 3),
            "repeats": lambda n: 9 if n <= 256 * KiB else (5 if n <= 4 * MiB else 3)}


def timed(algorithm, nbytes, p):
    return nbytes <= CAPS.get((algorithm, p), float("inf"))


def _all_reduce(name):
    from dist_sgd.comm.collectives import all_reduce

    if name == "gloo":
        return dist.all_reduce
    return lambda t: all_reduce(t, algorithm=name)


def _node_work(rank, world_size, quick):
    """In every node (one rank each): checks, ping-pong, then every all-reduce at every size."""
    from dist_sgd.comm.p2p import exchange_cpu, ping_pong
    from dist_sgd.plumbing.check import max_diff

    s = settings(quick)
    fns = {name: _all_reduce(name) for name in ALGORITHMS}
    inputs = [torch.randn(1001 + 4 * world_size, generator=torch.Generator().manual_seed(r))
              for r in range(world_size)]
    expected = torch.stack(inputs).sum(0)
    diffs = {}
    for name, fn in fns.items():
        t = inputs[rank].clone()
        fn(t)
        diffs[name] = max_diff(t, expected)
    sizes = s["pp"].get(world_size, s["pp"].get("other", ()))
    out = {"nodes": world_size, "diffs": diffs, "ping-pong": ping_pong(list(sizes), 5),
           "cpu": exchange_cpu(*s["cpu"]) if world_size == 2 else [], "cores": os.cpu_count()}
    out["all-reduce"] = {}
    for n in s["sizes"]:
        buffers = {name: torch.ones(n // 4) for name in ALGORITHMS if timed(name, n, world_size)}
        calls = {name: (lambda f=fns[name], b=b: f(b)) for name, b in buffers.items()}
        # Naive is timed apart, after the others: every rank sending to rank 0 at once leaves
        # TCP state that slows whatever runs next (gloo at 4 nodes, 4 MiB: a median of 615 ms
        # with naive in the alternation, 532 without; the link's 528): naive's cost, not the
        # next one's. The next size's warm-up calls absorb it.
        samples = time_alternating({a: c for a, c in calls.items() if a != "naive"},
                                   s["repeats"](n), warmup=1)
        if "naive" in calls:
            samples.update(time_alternating({"naive": calls["naive"]}, s["repeats"](n), warmup=1))
        if rank == 0:
            print(f"  {world_size} nodes, {costmodel.human_bytes(n)}: " + ", ".join(
                f"{a} {summarize(v)['median'] * 1e3:.1f} ms" for a, v in samples.items()),
                flush=True)
        out["all-reduce"].update({(name, n): v for name, v in samples.items()})
    return out


def _rows(out):
    rows = []
    p = out["nodes"]
    for r in out["ping-pong"]:
        rows.append({"part": "ping-pong", "nodes": p, "algorithm": "one way", "bytes": r["bytes"],
                     "seconds": r["seconds"], "min": r["min"], "max": r["max"], "max_diff": ""})
    for r in out.get("cpu", []):  # seconds: CPU seconds per message (every core's busy time)
        rows.append({"part": "cpu", "nodes": p, "algorithm": "exchange", "bytes": r["bytes"],
                     "seconds": r["seconds"], "min": r["min"], "max": r["max"], "max_diff": "",
                     "cores": out["cores"]})
    for (name, n), samples in out["all-reduce"].items():
        s = summarize(samples)
        rows.append({"part": "all-reduce", "nodes": p, "algorithm": name, "bytes": n,
                     "seconds": s["median"], "min": s["min"], "max": s["max"],
                     "max_diff": out["diffs"][name]})
    return rows


def measure(quick=False):
    rows = []
    for p in settings(quick)["nodes"]:
        print(f"  {p} nodes at {RATE}/s per link", flush=True)
        rows += _rows(nodes.on_nodes(__name__, p, quick))
    rows = netscale_with_model(rows)
    write_csv(NAME, rows, f"{machine_facts()}, {RATE}/s links (tbf, {cluster.SCALING_BURST} B "
                          f"bucket, TCP {netns.CONGESTION_CONTROL}) between network-namespace "
                          "nodes")
    return rows


def report(rows):
    """The measured points beside the model's predictions.

    Then one alpha-beta line is fitted once, to the 2-node ping-pong (every cluster's links are
    alike; the all-reduces it predicts never enter the fit), and predicts every measured point
    with the algorithm's steps (dist_sgd.scale.costmodel; gloo's all-reduce is a ring) twice:
    the link alone (`model_link`: what a cluster with a core per rank sees, the one lesson 10
    extrapolates with) and the link plus this machine's CPU (`model`: p ranks taking turns on
    its cores, with the CPU cost per message measured in step 2, never fitted to an all-reduce):
    dist_sgd.plumbing.figures' netscale_with_model and netscale_summary, which lesson 10 quotes.
    Capped to keep the run under 20 minutes: naive at 8 and 16 nodes stops at 4 MiB (one 16 MiB
    sample would take 20 and 40 s; its 1-4 MiB points already test its line).
    """
    rows = netscale_with_model(rows)  # from the fit of these rows (a CSV's model may be older)
    alpha, beta = netscale_fit(rows)
    rate = cluster.parse_rate(RATE) / 8  # bytes/s
    print(f"ping-pong, 2 nodes (<= 1 KiB, >= 2 MiB): alpha = {alpha * 1e6:.0f} us, "
          f"1/beta = {8 / beta / 1e6:.1f} Mbit/s = {1 / beta / rate:.1%} of the link's rate "
          f"(TCP's ceiling: {cluster.link_goodput(rate * 8) / rate:.1%})")
    s = netscale_summary(rows)
    if s["cpu"] is None:
        print("no CPU cost per message in these rows: the model is the link alone")
    else:
        kappa, per_byte, cores = s["cpu"]
        print(f"CPU per message, 2 nodes swapping (every core's busy time): {kappa * 1e6:.0f} us"
              f" + {per_byte * 1e9:.2f} ns per byte; {cores} cores, so p ranks take p/{cores} "
              "turns each")
    ar = netscale_table(rows)
    for p in sorted({q for _, q, _ in ar}):
        print(f"{p} nodes: all-reduce median ms, [model: link + CPU | link alone], model's error,"
              " bus bandwidth % of the link")
        for n in sorted({m for _, q, m in ar if q == p}):
            cells = [f"{a} {r['seconds'] * 1e3:7.1f} [{r['model'] * 1e3:7.1f} |"
                     f"{r['model_link'] * 1e3:7.1f}] {r['model'] / r['seconds'] - 1:+4.0%} "
                     f"{costmodel.bus_bandwidth(n, p, r['seconds']) / rate:4.0%}"
                     for a in ALGORITHMS if (r := ar.get((a, p, n)))]
            print(f"  {costmodel.human_bytes(n):>7s}  " + " | ".join(cells))
    worst = max(r["max_diff"] for r in ar.values())
    print(f"every all-reduce vs the single-machine sum: max difference {worst:.1e}")
    print("at >= 1 MiB, every node count:")
    print("  lowest bus bandwidth: " + ", ".join(f"{a} {v:.1%} of the link's rate"
                                                for a, v in s["bus"].items()))
    print(f"  our ring / gloo: at most {s['ring/gloo']:.3f}x")
    for a, (e, (_, p, n)) in s["error"]["model"].items():
        e_link, (_, p_link, n_link) = s["error"]["model_link"][a]
        print(f"  model vs measured, {a:16s}: worst {e:5.1%} ({p} nodes, "
              f"{costmodel.human_bytes(n)}); link alone {e_link:5.1%} ({p_link} nodes, "
              f"{costmodel.human_bytes(n_link)})")
    for (a, p), c in s["crossover"].items():
        print(f"  ring overtakes {a:16s} at {p:2d} nodes: {crossover_words(c)}")


def draw():
    if (measured := measured_as_root(NAME)) is None:
        return []
    rows, facts = measured
    from dist_sgd.bench import plots  # matplotlib: only where we draw

    rows = netscale_with_model(rows)
    alpha, beta = netscale_fit(rows)
    ar, rate = netscale_table(rows), cluster.parse_rate(RATE) / 8
    sizes = sorted({n for _, _, n in ar})
    fig, axes = plots.figure(3, (len(sizes) + 3) // 3, width=4.6, height=3.7)
    panels = [ax for row in axes for ax in row]
    ax = panels[0]
    pp = sorted((r for r in rows if r["part"] == "ping-pong"), key=lambda r: r["bytes"])
    for p in sorted({r["nodes"] for r in pp}):
        mine = [r for r in pp if r["nodes"] == p]
        ax.plot([r["bytes"] for r in mine], [r["bytes"] / r["seconds"] * 8 / 1e6 for r in mine],
                "o", ms=4, alpha=0.7, label=f"in the {p}-node cluster")
    fine = [2 ** (k / 4) for k in range(40, 4 * 24)]
    ax.plot(fine, [n / (alpha + beta * n) * 8 / 1e6 for n in fine], "k--",
            label=f"fit: alpha {alpha * 1e6:.0f} us, 1/beta {8 / beta / 1e6:.1f} Mbit/s")
    ax.axhline(rate * 8 / 1e6, color="gray", ls=":", label=f"link rate ({RATE}/s)")
    plots.bytes_axis(ax)
    ax.set_yscale("log")
    ax.set_xlabel("message size")
    ax.set_ylabel("one-way Mbit/s")
    ax.set_title("ping-pong between nodes 0 and 1", fontsize=9.5)
    ax.legend(fontsize=6.5)
    for ax, n in zip(panels[1:], sizes):
        for a in ALGORITHMS:
            pts = sorted((v for k, v in ar.items() if k[0] == a and k[2] == n),
                         key=lambda r: r["nodes"])
            if not pts:
                continue
            x = [r["nodes"] for r in pts]
            y = [r["seconds"] * 1e3 for r in pts]
            ax.errorbar(x, y, yerr=[[(r["seconds"] - r["min"]) * 1e3 for r in pts],
                                    [(r["max"] - r["seconds"]) * 1e3 for r in pts]],
                        fmt="o", ms=4, capsize=2, color=plots.color(a), label=f"{a} (measured)")
            ax.plot(x, [r["model"] * 1e3 for r in pts], "--", lw=1, color=plots.color(a))
            ax.plot(x, [r["model_link"] * 1e3 for r in pts], ":", lw=1, color=plots.color(a))
        ax.plot([], [], "k--", lw=1, label="model: link + this machine's CPU")
        ax.plot([], [], "k:", lw=1, label="model: link alone (what extrapolates)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({p for _, p, _ in ar}))
        ax.set_xticklabels([str(p) for p in sorted({p for _, p, _ in ar})])
        ax.set_yscale("log")
        ax.set_xlabel("nodes")
        ax.set_ylabel("ms per all-reduce")
        ax.set_title(f"all-reduce of {costmodel.human_bytes(n)}", fontsize=9.5)
        ax.grid(True, which="both", alpha=0.3)
        if n == sizes[0]:
            ax.legend(fontsize=6.5)
    for ax in panels[1 + len(sizes):]:
        ax.axis("off")
    title = (f"All-reduce on 2-16 emulated nodes, {RATE}/s links: measured (points), model "
             "with this machine's CPU (dashed), link alone (dotted)")
    return [plots.finish(fig, NAME, title, facts,
                         note="medians of alternated samples, whiskers min-max; gloo's model is "
                              "the ring's; naive capped at 4 MiB at 8 and 16 nodes; the "
                              "extrapolation (lesson 10) uses the link alone: on a cluster "
                              "every rank has its own cores")]


if __name__ == "__main__":
    nodes.node_main(_node_work, sys.argv[1:])
