"""Figure 6: at scale, on paper: what the cost model predicts for 1 to 1024 workers.

A data-parallel step = compute (forward + backward + update on the worker's own batch) +
one all-reduce of every gradient byte (costmodel.predict_step). We predict step time and
efficiency (weak scaling: per-worker throughput / one worker's) for ring, tree and a single
parameter server, on two kinds of setting:

  * BigNet, measured here: compute time of one step at 32 samples (one core) and its 4.8 MB of
    gradients, on a typical 10 Gbit/s Ethernet (alpha 25 us), a 100 Gbit/s RDMA network
    (alpha 5 us), and this machine's loopback (alpha, beta fitted in figure 2).
  * Published runs, to check the model against reality (all inputs approximate; we assume
    flat rings, one link per worker, fp32 gradients, gamma = 0 on GPUs):
      Goyal et al. 2017 ("ImageNet in 1 hour"): ResNet-50, 25.6 M params = 102 MB, 32 images
        per P100 at ~0.3 s per step (assumed), 50 Gbit/s Ethernet: ~90% efficiency at 256 GPUs.
      Sergeev & Del Balso 2018 (Horovod): ResNet-101, 44.5 M params = 178 MB, 64 images per
        Pascal GPU at ~0.5 s per step (assumed), 25 Gbit/s RoCE: ~88% at 128 GPUs.
"""
import torch

from dist_sgd.bench import p2p
from dist_sgd.bench.steps import batch, build, make_step
from dist_sgd.plumbing.figures import read_csv, write_csv
from dist_sgd.plumbing.timing import summarize, time_alternating
from dist_sgd.scale import costmodel
from dist_sgd.sgd import models

NAME = "atscale"
WORKERS = [2 ** k for k in range(11)]  # 1 .. 1024
ALGORITHMS = ("ring", "tree", "parameter_server")
NETWORKS = {"10 Gbit/s Ethernet": (10, 25), "100 Gbit/s RDMA": (100, 5)}  # Gbit/s, latency us
CAPTION = ("step = compute + all-reduce (no overlap), or max of the two (perfect overlap); "
           "compute measured on the machine below; networks: 10 GbE alpha 25 us, 100 Gbit/s "
           "RDMA alpha 5 us; published points: Goyal et al. 2017, Sergeev & Del Balso 2018")
PUBLISHED = [
    # setting, params, compute s/step (assumed), Gbit/s, latency us, GPUs, efficiency, source
    ("Goyal et al. 2017: ResNet-50, 50 Gbit/s", 25.6e6, 0.30, 50, 25, 256, 0.90,
     "Goyal et al. 2017, ImageNet in 1 hour"),
    ("Horovod 2018: ResNet-101, 25 Gbit/s", 44.5e6, 0.50, 25, 10, 128, 0.88,
     "Sergeev & Del Balso 2018, Horovod"),
]


def measure_compute(repeats):
    """Median seconds of one BigNet step (32 samples, forward+backward+update) in this process."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as every rank runs
    try:
        model = build("bignet")
        step = make_step("single process", model, *batch(32))
        seconds = summarize(time_alternating({"step": step}, repeats, 1)["step"])["median"]
    finally:
        torch.set_num_threads(threads)
    return seconds, 4 * models.count_parameters(model)


def predictions(setting, network, compute_s, nbytes, alpha, beta, gamma, algorithms):
    """The predicted step time and efficiency of each algorithm at 1 to 1024 workers.

    Every prediction is the link alone: there every worker has cores of its own. The CPU share
    that the emulated nodes need (costmodel's cpu=: p ranks taking turns on one machine's c cores,
    netscale and nettrain) belongs to the machine they were measured on, not to a cluster.

    "no overlap": communication starts after backward (average_gradients). "perfect overlap":
    it all hides behind backward (what DDP buckets aim at) - real systems sit in between.
    A ring over GPUs numbered node by node crosses each node's network card once per step, so
    several GPUs per node sharing one card does not change the ring's per-link bytes.
    """
    rows = []
    for algorithm in algorithms:
        for overlap in (0, 1):
            for p in WORKERS:
                step, eff = costmodel.predict_step(compute_s, nbytes, p, algorithm, alpha, beta,
                                                   gamma, overlap=bool(overlap))
                rows.append({"setting": setting, "network": network, "algorithm": algorithm,
                             "overlap": overlap, "workers": p, "compute_s": compute_s,
                             "nbytes": nbytes, "alpha": alpha, "beta": beta, "gamma": gamma,
                             "step_s": float(step), "efficiency": float(eff),
                             "published_efficiency": "", "source": ""})
    return rows


def measure(quick=False):
    rows = all_predictions(*measure_compute(3 if quick else 9))
    write_csv(NAME, rows)
    return rows


def all_predictions(compute_s, nbytes):
    """Every row of the CSV from BigNet's compute time and gradient bytes (and figure 2's fit)."""
    rows = []
    for network, (gbit, lat) in NETWORKS.items():
        rows += predictions("BigNet (measured)", network, compute_s, nbytes,
                            *costmodel.link(gbit, lat), 0.0, ALGORITHMS)
    loop = p2p.load_fit()
    if loop is not None:
        rows += predictions("BigNet (measured)", "this machine's loopback (fig. 2)", compute_s,
                            nbytes, loop[0], loop[1], 0.0, ALGORITHMS)
    for setting, params, comp, gbit, lat, gpus, eff, source in PUBLISHED:
        rows += predictions(setting, f"{gbit} Gbit/s", comp, 4 * params,
                            *costmodel.link(gbit, lat), 0.0, ("ring",))
        rows.append({**rows[-1], "algorithm": "published", "overlap": "", "workers": gpus,
                     "step_s": "", "efficiency": "", "published_efficiency": eff,
                     "source": source})
    return rows


def report(rows):
    big = [r for r in rows if r["setting"] == "BigNet (measured)"]
    if big:
        print(f"BigNet: measured compute {big[0]['compute_s'] * 1e3:.1f} ms per step (32 samples, "
              f"1 core), {big[0]['nbytes'] / 1e6:.1f} MB of gradients; predicted efficiency, "
              "no overlap:")
        shown = (2, 8, 64, 256, 1024)
        print(f"  {'network':34s} {'algorithm':17s} "
              + " ".join(f"{'p=' + str(p):>6s}" for p in shown))
        for net in dict.fromkeys(r["network"] for r in big):
            for a in ALGORITHMS:
                eff = {r["workers"]: r["efficiency"] for r in big
                       if r["network"] == net and r["algorithm"] == a and r["overlap"] == 0}
                print(f"  {net:34s} {a:17s} " + " ".join(f"{eff[p]:6.1%}" for p in shown))
    for ref in (r for r in rows if r["algorithm"] == "published"):
        pred = {r["overlap"]: r for r in rows if r["setting"] == ref["setting"]
                and r["algorithm"] == "ring" and r["workers"] == ref["workers"]}
        comm = pred[0]["step_s"] - pred[0]["compute_s"]
        print(f"{ref['setting']} ({ref['source']}), {ref['workers']} GPUs: published "
              f"~{ref['published_efficiency']:.0%}; ring model predicts "
              f"{pred[0]['efficiency']:.0%} with no overlap (compute {pred[0]['compute_s']:.2f} s "
              f"+ all-reduce {comm * 1e3:.0f} ms of {ref['nbytes'] / 1e6:.0f} MB) and "
              f"{pred[1]['efficiency']:.0%} with perfect overlap")


def draw():
    from matplotlib.ticker import FuncFormatter

    from dist_sgd.bench import plots  # matplotlib: only where we draw (ranks never need it)

    rows, facts = read_csv(NAME)
    fig, axes = plots.figure(3, width=5.6, height=5.2)
    ax_eff, ax_step, ax_pub = axes[0]
    styles = ["-", "--", ":"]
    big = [r for r in rows if r["setting"] == "BigNet (measured)" and r["overlap"] == 0]
    for net, ls in zip(dict.fromkeys(r["network"] for r in big), styles):
        for a in ALGORITHMS:
            pts = [r for r in big if r["network"] == net and r["algorithm"] == a]
            x = [r["workers"] for r in pts]
            ax_eff.plot(x, [r["efficiency"] for r in pts], ls, color=plots.color(a))
            ax_step.plot(x, [r["step_s"] * 1e3 for r in pts], ls, color=plots.color(a))
        for ax in (ax_eff, ax_step):  # legend: line style = network
            ax.plot([], [], ls, color="black", label=f"network: {net}")
    for a in ALGORITHMS:  # legend: colour = algorithm
        for ax in (ax_eff, ax_step):
            ax.plot([], [], "-", lw=3, color=plots.color(a), label=f"all-reduce: {a}")
    if big:
        ax_step.axhline(big[0]["compute_s"] * 1e3, color="gray", lw=3, alpha=0.5,
                        label="compute alone (measured)")
        ax_eff.set_title(f"BigNet ({big[0]['nbytes'] / 1e6:.1f} MB grads, "
                         f"{big[0]['compute_s'] * 1e3:.0f} ms compute): predicted efficiency, "
                         "no overlap", fontsize=9)
    ax_step.set_title("BigNet: predicted step time (no overlap)", fontsize=9)
    ax_step.set_yscale("log")
    ax_step.set_ylabel("time per step (ms)")
    ax_step.legend(fontsize=7, loc="upper left")
    for i, ref in enumerate(r for r in rows if r["algorithm"] == "published"):
        color = ["tab:blue", "tab:orange", "tab:green"][i % 3]
        # perfect overlap gives 100% for every run: dashes offset by run, so no line hides another
        for overlap, ls in ((0, "-"), (1, (5 * i, (5, 5)))):
            pts = [r for r in rows if r["setting"] == ref["setting"] and r["algorithm"] == "ring"
                   and r["overlap"] == overlap]
            ax_pub.plot([r["workers"] for r in pts], [r["efficiency"] for r in pts], ls=ls,
                        color=color, label=f"{ref['setting']}: ring, "
                                           + ("perfect overlap" if overlap else "no overlap"))
        ax_pub.plot(ref["workers"], ref["published_efficiency"], "*", ms=15, color=color,
                    mec="black", label=f"published: {ref['source']}")
    ax_pub.set_title("Model vs published large runs (approximate inputs)", fontsize=10)
    ax_pub.legend(fontsize=6.5, loc="lower left")
    for ax in (ax_eff, ax_step, ax_pub):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.0f}"))
        ax.set_xlabel("workers")
        ax.grid(True, which="both", alpha=0.3)
    for ax in (ax_eff, ax_pub):
        ax.set_ylabel("efficiency = compute / step")
        ax.set_ylim(0, 1.05)
    ax_eff.legend(fontsize=7, loc="lower left")
    title = "At scale, on paper: the alpha-beta cost model from 1 to 1024 workers"
    return [plots.finish(fig, NAME, title, facts, note=CAPTION)]
