"""Lesson 11's figure: 2 nodes (network namespaces, dist_sgd.scale.cluster) on a 1 Gbit/s link.

    python -m dist_sgd.bench cluster          # needs root; skips with the reason otherwise

Runs itself once in every node (`python -m dist_sgd.bench.cluster --node OUT`, one rank per node,
as torchrun --nproc-per-node 1 would), node 0 leaves the samples in OUT, and the parent writes
cluster.csv and draws cluster.png (in the benchmark's folder): ping-pong on the link (alpha,
beta fitted), all-reduce bus bandwidth of gloo, our ring and a ring step's two exchange orders,
and lesson 07's DDP strategies on BigNet with the cost model's prediction. It prints the ratios that
matter (ring / gloo, DDP / average_gradients, model / measured). Everything compared is
measured alternately in one run (medians).
"""
import os
import pickle
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.nn.functional as F

from dist_sgd.bench import nodes
from dist_sgd.plumbing.figures import machine_facts, read_csv, write_csv
from dist_sgd.plumbing.timing import summarize, time_alternating
from dist_sgd.scale import cluster, costmodel, netns
from dist_sgd.sgd.models import BigNet, count_parameters

NAME = "cluster"
NODES, RATE = 2, "1gbit"
BATCH = 16  # per node: BigNet's backward then takes about as long as its all-reduce (4.8 MB)
MiB = 2 ** 20
RING_ORDERS = {"ring, isend before recv": False, "ring, irecv before isend": True}
STRATEGIES = ("no communication", "forward only", "average_gradients", "per-parameter hooks",
              "our DDP", "torch DDP")


def _ring(t, recv_first):
    """A textbook ring all-reduce whose exchanges post irecv first or isend first (lesson 11)."""
    r, p = dist.get_rank(), dist.get_world_size()
    chunks = t.tensor_split(p)
    for step in range(2 * (p - 1)):
        mine, theirs = chunks[(r - step) % p], chunks[(r - step - 1) % p]
        incoming = torch.empty_like(theirs)
        if recv_first:
            request = dist.irecv(incoming, (r - 1) % p)
            dist.isend(mine, (r + 1) % p).wait()
        else:
            request = dist.isend(mine, (r + 1) % p)
            dist.recv(incoming, (r - 1) % p)
        request.wait()
        if step < p - 1:
            theirs.add_(incoming)
        else:
            theirs.copy_(incoming)
    return t


def _algorithms():
    from dist_sgd.comm import collectives

    algos = {"gloo": dist.all_reduce, "our ring": collectives.all_reduce}
    algos.update({name: (lambda t, o=order: _ring(t, o)) for name, order in RING_ORDERS.items()})
    return algos


def _ddp_steps(rank, batch, repeats):
    from torch.nn.parallel import DistributedDataParallel as TorchDDP

    from dist_sgd.plumbing.check import max_diff
    from dist_sgd.ddp.ddp import DistributedDataParallel
    from dist_sgd.ddp.steps import HookDDP, NaiveDDP

    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(batch, 1, 28, 28, generator=gen)
    y = torch.randint(0, 10, (batch,), generator=gen)

    def bignet():
        torch.manual_seed(0)
        return BigNet().eval()  # no dropout: every strategy computes the same gradients

    models = {"no communication": bignet(), "average_gradients": NaiveDDP(bignet(), flat=True),
              "per-parameter hooks": HookDDP(bignet()),
              "our DDP": DistributedDataParallel(bignet(), bucket_cap_mb=1),
              "torch DDP": TorchDDP(bignet(), bucket_cap_mb=1)}

    def step(model):
        model.zero_grad(set_to_none=True)
        F.nll_loss(model(x), y).backward()
        getattr(model, "finish_gradient_synchronization", lambda: None)()

    candidates = {n: (lambda m=m: step(m)) for n, m in models.items()}
    candidates["forward only"] = lambda: F.nll_loss(models["no communication"](x), y)
    times = time_alternating(candidates, repeats=repeats, warmup=2)
    ref = [p.grad for p in models["torch DDP"].parameters()]
    diffs = {n: max_diff([p.grad for p in models[n].parameters()], ref) for n in models
             if n not in ("torch DDP", "no communication")}
    dist.barrier()  # torch's reducer finishes before anyone tears the group down
    return times, diffs


def _node_work(rank, world_size, quick):
    from dist_sgd.plumbing.check import max_diff
    from dist_sgd.comm.p2p import ping_pong

    repeats = 3 if quick else 10
    sizes = range(10, 23, 2) if quick else range(10, 25)
    out = {"ping-pong": ping_pong([2 ** k for k in sizes], repeats)}
    algos = _algorithms()
    inputs = [torch.randn(MiB, generator=torch.Generator().manual_seed(r))
              for r in range(world_size)]
    out["check"] = {}
    for name, fn in algos.items():
        t = inputs[rank].clone()
        fn(t)
        out["check"][name] = max_diff(t, torch.stack(inputs).sum(0))
    sizes = [1, 4] if quick else [0.25, 1, 4, 16]
    buffers = {m: torch.ones(int(m * MiB) // 4) for m in sizes}
    out["all-reduce"] = time_alternating(
        {(n, m): (lambda fn=fn, b=b: fn(b)) for n, fn in algos.items() for m, b in buffers.items()},
        repeats=repeats, warmup=1)
    out["steps"], out["grad diffs"] = _ddp_steps(rank, BATCH, 5 if quick else 20)
    return out


def measure(quick=False):
    problem = netns.privilege_problem()
    if problem:
        print(f"cluster: skipped: {problem}")
        return None
    links_before, load = nodes.host_links(), os.getloadavg()
    out_path = os.path.join(tempfile.mkdtemp(prefix="dist_sgd_cluster_"), "samples.pkl")
    with cluster.Cluster(NODES, rate=RATE) as c:
        names = [c.switch] + c.netns
        # One rank per node, one thread: what torchrun --nproc-per-node 1 would set.
        cmd = ["env", "RANK=$NODE_RANK", "WORLD_SIZE=$NNODES", "OMP_NUM_THREADS=1", sys.executable,
               "-m", "dist_sgd.bench.cluster", "--node", out_path]
        c.run(cmd + (["--quick"] if quick else []), timeout=1800)
    left = [n for n in netns.ours() if n in names]
    left += sorted(set(nodes.host_links()) - set(links_before))
    print(f"  left behind by the cluster: {' '.join(left) or 'nothing'}", flush=True)
    with open(out_path, "rb") as f:
        out = pickle.load(f)
    rows = _rows(out)
    facts = (f"{machine_facts()}, {NODES} nodes (network namespaces) at {RATE}/s each way, "
             f"load average {load[0]:.1f} at the start, TCP {netns.CONGESTION_CONTROL}"
             + (" (other jobs on this machine)" if load[0] >= 1.5 else ""))
    write_csv(NAME, rows, facts)
    return rows


def _rows(out):
    rows = []

    def add(part, name, nbytes, samples, diff=""):
        s = summarize(samples)
        rows.append({"part": part, "name": name, "bytes": int(nbytes), "seconds": s["median"],
                     "min": s["min"], "max": s["max"], "max_diff": diff})

    for r in out["ping-pong"]:
        rows.append({"part": "ping-pong", "name": "one way", "bytes": r["bytes"],
                     "seconds": r["seconds"], "min": r["min"], "max": r["max"], "max_diff": ""})
    for (name, m), samples in out["all-reduce"].items():
        add("all-reduce", name, m * MiB, samples, out["check"][name])
    nbytes = 4 * count_parameters(BigNet())  # BigNet's gradients, float32
    for name in STRATEGIES:
        add("BigNet step", name, nbytes, out["steps"][name], out["grad diffs"].get(name, ""))
    return rows


def _by_part(rows):
    parts = {}
    for r in rows:
        parts.setdefault(r["part"], []).append(r)
    return parts


def fit_sizes(rows):
    """The ping-pong rows the alpha-beta line is fitted to: small messages (alpha) and >= 1 MiB.
    tbf's token bucket (128 KiB at 1 Gbit/s) lets the first 128 KiB of a message pass at memory
    speed, so 16-512 KiB messages look faster than the link: an artefact of the shaper."""
    return [r for r in rows if r["bytes"] <= 4096 or r["bytes"] >= MiB]


def fit(rows):
    pp = fit_sizes(_by_part(rows)["ping-pong"])
    return costmodel.fit_alpha_beta([r["bytes"] for r in pp], [r["seconds"] for r in pp])


def predictions(rows):
    """Predicted step times of average_gradients (no overlap) and our DDP (overlapping
    backward)."""
    alpha, beta = fit(rows)
    st = {r["name"]: r for r in _by_part(rows)["BigNet step"]}
    compute, forward = st["no communication"]["seconds"], st["forward only"]["seconds"]
    nbytes = st["average_gradients"]["bytes"]
    after, _ = costmodel.predict_step(compute, nbytes, NODES, "ring", alpha, beta)
    hidden, _ = costmodel.predict_step(compute - forward, nbytes, NODES, "ring", alpha, beta,
                                       overlap=True)
    return {"average_gradients": after, "our DDP": forward + hidden}


def report(rows):
    rate = cluster.parse_rate(RATE) / 8  # bytes/s
    parts = _by_part(rows)
    alpha, beta = fit(rows)
    print(f"ping-pong over the {RATE} link: alpha = {alpha * 1e6:.0f} us, 1/beta = "
          f"{8 / beta / 1e9:.3f} Gbit/s ({1 / beta / rate:.0%} of the link's rate)")
    for r in parts["ping-pong"]:
        print(f"  {costmodel.human_bytes(r['bytes']):>8s} one way {r['seconds'] * 1e3:8.3f} ms "
              f"{r['bytes'] * 8 / r['seconds'] / 1e9:6.3f} Gbit/s")
    ar = {(r["name"], r["bytes"]): r for r in parts["all-reduce"]}
    sizes = sorted({b for _, b in ar})
    names = list(dict.fromkeys(n for n, _ in ar))
    print("all-reduce, 2 nodes: median ms (bus bandwidth as % of the link's rate)")
    for b in sizes:
        print(f"  {costmodel.human_bytes(b):>8s} " + " | ".join(
            f"{n} {ar[n, b]['seconds'] * 1e3:6.1f} "
            f"({costmodel.bus_bandwidth(b, NODES, ar[n, b]['seconds']) / rate:4.0%})"
            for n in names))
    worst = max(ar[n, b]["max_diff"] for n, b in ar)
    print(f"  every algorithm vs the single-machine sum: max difference {worst:.1e}")
    st = {r["name"]: r for r in parts["BigNet step"]}
    pred = predictions(rows)
    print(f"BigNet, {BATCH} samples per node, one step (median ms):")
    for name, r in st.items():
        extra = f"  predicted {pred[name] * 1e3:6.1f}" if name in pred else ""
        diff = f"  grads vs torch DDP {r['max_diff']:.1e}" if r["max_diff"] != "" else ""
        print(f"  {name:20s} {r['seconds'] * 1e3:7.1f}{extra}{diff}")

    big = [b for b in sizes if b >= 4 * MiB]
    bus = min(costmodel.bus_bandwidth(b, NODES, ar["gloo", b]["seconds"]) / rate for b in big)
    ring = max(ar["our ring", b]["seconds"] / ar["gloo", b]["seconds"] for b in sizes if b >= MiB)
    fast = max(ar["ring, irecv before isend", b]["seconds"] / ar["gloo", b]["seconds"]
               for b in sizes if b >= MiB)
    speedup = st["average_gradients"]["seconds"] / st["our DDP"]["seconds"]
    model = {n: pred[n] / st[n]["seconds"] - 1 for n in pred}
    print("\nthe ratios, measured:")
    print(f"  gloo bus bandwidth at >= 4 MiB: {bus:.0%} of the link's rate at the worst size")
    print(f"  our ring / gloo at >= 1 MiB: {ring:.2f}x at the worst size; "
          f"the irecv-first ring of lesson 11: {fast:.2f}x")
    print(f"  bucketed DDP (ours, 1 MiB buckets) vs average_gradients: {speedup:.2f}x faster; "
          f"torch DDP: "
          f"{st['average_gradients']['seconds'] / st['torch DDP']['seconds']:.2f}x")
    print("  cost model vs measured step: " + ", ".join(f"{n} {e:+.0%}" for n, e in model.items()))


def draw():
    try:
        rows, facts = read_csv(NAME)
    except FileNotFoundError:
        print("cluster: no cluster.csv yet (measure as root first); nothing to draw")
        return []
    from dist_sgd.bench import plots  # matplotlib: only where we draw

    report(rows)
    rate = cluster.parse_rate(RATE) / 8
    parts = _by_part(rows)
    alpha, beta = fit(rows)
    fig, axes = plots.figure(3, height=4.8)
    ax_pp, ax_ar, ax_st = axes[0]

    pp = parts["ping-pong"]
    n = [r["bytes"] for r in pp]
    ax_pp.plot(n, [r["bytes"] / r["seconds"] * 8 / 1e9 for r in pp], "o-",
               label="measured (median)")
    fine = torch.logspace(10, 24, 100, base=2).tolist()
    ax_pp.plot(fine, [b / (alpha + beta * b) * 8 / 1e9 for b in fine], "--", color="black",
               label=f"fit: alpha = {alpha * 1e6:.0f} us,\n1/beta = {8 / beta / 1e9:.2f} Gbit/s "
                     "(on <= 4 KiB, >= 1 MiB;\ntbf's bucket speeds up the middle)")
    ax_pp.axhline(rate * 8 / 1e9, color="gray", ls=":", label=f"link rate ({RATE}/s)")
    plots.bytes_axis(ax_pp)
    ax_pp.set_yscale("log")
    ax_pp.set_xlabel("message size")
    ax_pp.set_ylabel("one-way bandwidth (Gbit/s)")
    ax_pp.set_title("ping-pong between the 2 nodes")
    ax_pp.legend(fontsize=7, loc="lower right")

    colors = {"gloo": "tab:red", "our ring": "tab:blue", "ring, isend before recv": "tab:gray",
              "ring, irecv before isend": "tab:green"}
    for name, color in colors.items():
        rs = sorted((r for r in parts["all-reduce"] if r["name"] == name), key=lambda r: r["bytes"])
        ax_ar.plot([r["bytes"] for r in rs],
                   [costmodel.bus_bandwidth(r["bytes"], NODES, r["seconds"]) * 8 / 1e9 for r in rs],
                   "o-", color=color, label=name)
    ax_ar.axhline(rate * 8 / 1e9, color="gray", ls=":", label=f"link rate ({RATE}/s)")
    plots.bytes_axis(ax_ar)
    ax_ar.set_ylim(bottom=0)
    ax_ar.set_xlabel("all-reduce size")
    ax_ar.set_ylabel("bus bandwidth (Gbit/s)")
    ax_ar.set_title("all-reduce across 2 nodes")
    ax_ar.legend(fontsize=8, loc="lower right")

    st = [r for r in parts["BigNet step"] if r["name"] != "forward only"]
    pred = predictions(rows)
    y = range(len(st))
    ax_st.barh(list(y), [r["seconds"] * 1e3 for r in st], color="tab:blue",
               label="measured (median)")
    ax_st.errorbar([r["seconds"] * 1e3 for r in st], list(y),
                   xerr=[[(r["seconds"] - r["min"]) * 1e3 for r in st],
                         [(r["max"] - r["seconds"]) * 1e3 for r in st]],
                   fmt="none", color="black", lw=0.8)
    marks = [(i, pred[r["name"]] * 1e3) for i, r in enumerate(st) if r["name"] in pred]
    ax_st.plot([m for _, m in marks], [i for i, _ in marks], "D", color="tab:orange",
               label="cost model's prediction")
    ax_st.set_yticks(list(y))
    ax_st.set_yticklabels([r["name"] for r in st])
    ax_st.invert_yaxis()
    ax_st.set_xlabel(f"ms per step (BigNet, {BATCH} samples per node)")
    ax_st.set_title("one training step, 2 nodes")
    ax_st.legend(fontsize=8)
    for ax in (ax_pp, ax_ar):
        ax.tick_params(axis="x", labelrotation=45, labelsize=8)
    title = (f"Two nodes on a {cluster.parse_rate(RATE) / 1e9:g} Gbit/s link (network namespaces, "
             "tbf)")
    return [plots.finish(fig, NAME, title, facts,
                         note="medians of alternated samples; whiskers min-max; DDPs with 1 MiB "
                              "buckets; prediction = alpha-beta fit of the ping-pong")]


if __name__ == "__main__":
    nodes.node_main(_node_work, sys.argv[1:])
