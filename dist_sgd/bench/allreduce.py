"""Figure 1 (and the ours-vs-gloo benchmark): all-reduce bus bandwidth, our algorithms vs gloo.

For world sizes 2, 3, 4 and messages of 16 KiB to 64 MiB, every algorithm in
dist_sgd.comm.collectives.ALL_REDUCE_ALGORITHMS (the textbook ring and the pipelined one among
them) and gloo's torch.distributed.all_reduce run alternately in one run
(dist_sgd.plumbing.timing.time_alternating: A B C ... A B C, slowest rank per sample), and we print
each one's median time and its ratio to gloo.

Bus bandwidth = bytes * 2(p-1)/p / time (NCCL's convention): it divides out the bytes a ring
must move, so a good all-reduce shows the link's speed at every p.

The model lines: per world size, one alpha and one beta fitted to all four of our algorithms
at once (costmodel.fit_all_reduce), with gamma (seconds per byte to add) measured separately
by timing a local add on every rank at the same time. If the model is right, one (alpha,
beta) explains all four curves; where it does not, the printout says by how much.
"""
import numpy as np
import torch
import torch.distributed as dist

from dist_sgd.bench import common
from dist_sgd.plumbing.figures import read_csv
from dist_sgd.plumbing.timing import summarize, time_alternating
from dist_sgd.scale import costmodel

NAME = "allreduce"
RINGS = ("ring", "ring_pipelined")
CAPTION = ("dots/line: median; band: min-max over repeats (slowest rank per sample); dotted: "
           "alpha-beta-gamma cost model, alpha and beta fitted per algorithm and world size, "
           "gamma from a timed local add")


def settings(quick):
    if quick:
        return {"world_sizes": (2, 4), "sizes": [2 ** k for k in range(14, 24, 3)], "repeats": 3}
    return {"world_sizes": (2, 3, 4), "sizes": [2 ** k for k in range(14, 27)], "repeats": 21}


def _gamma(nbytes_list):
    """Seconds per byte of acc.add_(x), every rank adding at once (as inside an all-reduce)."""
    big = [n for n in nbytes_list if n >= 2 ** 20] or nbytes_list[-1:]
    bufs = {n: (torch.ones(n // 4), torch.ones(n // 4)) for n in big}
    times = time_alternating({n: (lambda a=a, b=b: a.add_(b)) for n, (a, b) in bufs.items()},
                             repeats=5, warmup=1)
    if len(big) == 1:
        return summarize(times[big[0]])["median"] / big[0]
    return costmodel.fit_alpha_beta(big, [summarize(times[n])["median"] for n in big])[1]


def check_against_torch(n=1007):
    """Every algorithm of ours against torch.distributed.all_reduce on the same random input
    (an odd size: uneven chunks). Raises if one differs; returns the max difference."""
    from dist_sgd.comm.collectives import ALL_REDUCE_ALGORITHMS, all_reduce

    x = torch.randn(n, generator=torch.Generator().manual_seed(dist.get_rank()))
    expected = x.clone()
    dist.all_reduce(expected)
    max_diff = 0.0
    for algorithm in ALL_REDUCE_ALGORITHMS:
        got = x.clone()
        all_reduce(got, algorithm=algorithm)
        torch.testing.assert_close(got, expected)
        max_diff = max(max_diff, (got - expected).abs().max().item())
    return max_diff


def _worker(rank, world_size, sizes, repeats):
    from dist_sgd.comm.collectives import ALL_REDUCE_ALGORITHMS, all_reduce

    max_diff = check_against_torch()  # a benchmark of a wrong answer is worthless

    gamma = _gamma(sizes)
    rows = []
    for nbytes in sizes:
        # One buffer per candidate; sums of ones grow by p per call, far from overflow here.
        bufs = {name: torch.ones(nbytes // 4) for name in (*ALL_REDUCE_ALGORITHMS, "gloo")}
        candidates = {name: (lambda t=bufs[name], a=name: all_reduce(t, algorithm=a))
                      for name in ALL_REDUCE_ALGORITHMS}
        candidates["gloo"] = lambda t=bufs["gloo"]: dist.all_reduce(t)
        big = nbytes >= 2 ** 24
        # Medians of ~20 samples: single samples on a shared 2-core machine swing 2-4x.
        samples = time_alternating(candidates, repeats=max(3, repeats // 2 if big else repeats),
                                   warmup=1)
        for name, times in samples.items():
            s = summarize(times)
            rows.append({"world_size": world_size, "algorithm": name, "bytes": nbytes,
                         "seconds": s["median"], "min": s["min"], "max": s["max"], "n": s["n"],
                         "bus_bandwidth": float(costmodel.bus_bandwidth(nbytes, world_size,
                                                                        s["median"])),
                         "gamma": gamma, "check_max_diff": max_diff})
        del bufs, candidates
    return rows


def measure(quick=False):
    s = settings(quick)
    return common.over_world_sizes(NAME, _worker, s["world_sizes"], s["sizes"], s["repeats"])


def fits(rows):
    """{world size: {"gamma": g, "joint": (alpha, beta), algorithm: (alpha, beta), ...}}.

    Per algorithm: alpha and beta fitted to that algorithm's medians alone (its alpha then
    includes its own per-message Python overhead). Joint: one (alpha, beta) for all of our
    algorithms at once, the stronger test: does one network explain every algorithm?
    (Algorithms the cost model does not know are measured and drawn, but not fitted.)
    """
    out = {}
    for p in sorted({r["world_size"] for r in rows}):
        ours = [r for r in rows if r["world_size"] == p and r["algorithm"] in costmodel.ALGORITHMS]
        fit = {"gamma": next(r["gamma"] for r in rows if r["world_size"] == p)}

        def one(pts):
            return costmodel.fit_all_reduce([r["algorithm"] for r in pts],
                                            [r["bytes"] for r in pts], [p] * len(pts),
                                            [r["seconds"] for r in pts], gamma=fit["gamma"])
        try:
            fit["joint"] = one(ours) if ours else (float("nan"), float("nan"))
        except ValueError:  # on a loaded machine the timed add can outlast a whole all-reduce
            fit["gamma_measured"], fit["gamma"] = fit["gamma"], 0.0
            fit["joint"] = one(ours)
        for a in dict.fromkeys(r["algorithm"] for r in ours):
            fit[a] = one([r for r in ours if r["algorithm"] == a])
        out[p] = fit
    return out


def _error(fit, key, algorithm, row):
    alpha, beta = fit[key]
    t = costmodel.predict_all_reduce(algorithm, row["bytes"], row["world_size"], alpha, beta,
                                     fit["gamma"])
    return (t - row["seconds"]) / row["seconds"]


def report(rows):
    """Time and ratio to gloo per algorithm and size, the goals, the model's fit and error."""
    from dist_sgd.scale.costmodel import human_bytes

    by = {(r["world_size"], r["algorithm"], r["bytes"]): r for r in rows}
    model = fits(rows)
    print(f"correctness: every algorithm equals torch.distributed.all_reduce, "
          f"max diff {max(r['check_max_diff'] for r in rows):.1e}")
    for p, fit in model.items():
        sizes = sorted({r["bytes"] for r in rows if r["world_size"] == p})
        algorithms = [a for a in dict.fromkeys(r["algorithm"] for r in rows if r["world_size"] == p)
                      if a != "gloo"]
        fitted = [a for a in algorithms if a in fit]
        print(f"\nworld size {p}: median time per all-reduce (ratio ours/gloo); "
              "gloo's bus bandwidth")
        print(f"  {'size':>8s} " + " ".join(f"{a:>17s}" for a in algorithms)
              + f" {'gloo':>10s} {'gloo busbw':>11s}")
        for n in sizes:
            g = by[(p, "gloo", n)]["seconds"]
            cells = " ".join(f"{by[(p, a, n)]['seconds'] * 1e3:8.2f}ms "
                             f"({by[(p, a, n)]['seconds'] / g:4.2f}x)" for a in algorithms)
            print(f"  {human_bytes(n):>8s} {cells} {g * 1e3:8.2f}ms "
                  f"{by[(p, 'gloo', n)]['bus_bandwidth'] / 1e9:7.2f}GB/s")
        for a in algorithms:
            ratio = [by[(p, a, n)]["seconds"] / by[(p, "gloo", n)]["seconds"]
                     for n in sizes if n >= 2 ** 20 and (p, a, n) in by]
            if ratio:
                print(f"  {a} / gloo for >= 1 MiB: median {np.median(ratio):.2f}x, "
                      f"worst {max(ratio):.2f}x")
        unusable = (f" (the timed add, {fit['gamma_measured'] * 1e12:.0f} ps/byte, alone outlasts "
                    "some all-reduces: a loaded machine)" if "gamma_measured" in fit else "")
        print(f"  cost model, gamma (local add, all ranks at once) = "
              f"{fit['gamma'] * 1e12:.0f} ps/byte{unusable}; fitted per algorithm:")
        print(f"  {'':>8s} " + " ".join(f"{a:>17s}" for a in fitted))
        print(f"  {'alpha':>8s} " + " ".join(f"{fit[a][0] * 1e6:15.0f}us" for a in fitted))
        print(f"  {'1/beta':>8s} " + " ".join(f"{costmodel.bandwidth(fit[a][1]) / 1e9:13.2f}GB/s"
                                             for a in fitted))
        print("  model error (predicted - measured) / measured, per-algorithm fit:")
        for n in sizes:
            print(f"  {human_bytes(n):>8s} " + " ".join(
                f"{_error(fit, a, a, by[(p, a, n)]):+17.0%}" for a in fitted))
        big = [by[(p, a, n)] for a in fitted for n in sizes if n >= 2 ** 20]
        if big:
            worst = max(abs(_error(fit, r["algorithm"], r["algorithm"], r)) for r in big)
            joint = max(abs(_error(fit, "joint", r["algorithm"], r)) for r in big)
            print(f"  worst error for >= 1 MiB: {worst:.0%} per-algorithm fit; "
                  f"{joint:.0%} with one joint fit (alpha = {fit['joint'][0] * 1e6:.0f} us, "
                  f"1/beta = {costmodel.bandwidth(fit['joint'][1]) / 1e9:.2f} GB/s) "
                  f"for all {len(fitted)}")


def draw():
    from dist_sgd.bench import plots  # matplotlib: only where we draw (ranks never need it)

    rows, facts = read_csv(NAME)
    model = fits(rows)
    fig, axes = plots.figure(len(model), width=5.6, height=5.0)
    for ax, (p, fit) in zip(axes[0], model.items()):
        for name in dict.fromkeys(r["algorithm"] for r in rows if r["world_size"] == p):
            pts = sorted((r for r in rows if r["world_size"] == p and r["algorithm"] == name),
                         key=lambda r: r["bytes"])
            n = np.array([r["bytes"] for r in pts], dtype=float)
            bw = lambda t: costmodel.bus_bandwidth(n, p, np.array(t)) / 1e9  # noqa: E731
            color = plots.color(name)
            label = "gloo (torch.distributed)" if name == "gloo" else f"ours: {name}"
            ax.fill_between(n, bw([r["max"] for r in pts]), bw([r["min"] for r in pts]),
                            color=color, alpha=0.1)
            ax.plot(n, bw([r["seconds"] for r in pts]), "o-" if name != "gloo" else "s-",
                    color=color, label=label, ms=4, lw=2 if name in (*RINGS, "gloo") else 1.2)
            if name in fit:
                fine = np.geomspace(n.min(), n.max(), 100)
                t = costmodel.predict_all_reduce(name, fine, p, *fit[name], fit["gamma"])
                ax.plot(fine, costmodel.bus_bandwidth(fine, p, t) / 1e9, ":", color=color, lw=1.3)
        ax.plot([], [], ":", color="black", label="dotted: cost model (fit)")
        ax.fill_between([], [], [], color="gray", alpha=0.2, label="band: min-max")
        plots.bytes_axis(ax)
        ax.set_yscale("log")
        ax.set_xlabel("message size (float32)")
        ax.set_ylabel("bus bandwidth (GB/s) = bytes * 2(p-1)/p / time")
        over = f" (oversubscribed: > {plots.cores(facts)} cores)" if p > plots.cores(facts) else ""
        ax.set_title(f"world size {p}{over}", fontsize=11)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7.5, loc="lower right")
    title = "All-reduce: our send/recv algorithms vs gloo, processes on one host"
    return [plots.finish(fig, NAME, title, facts, note=CAPTION)]
