"""Weak scaling on a network: one training step of BigNet on 1, 2, 4 and 8 emulated nodes.

    sudo python3 -m dist_sgd.bench nettrain      # needs root (network namespaces); ~6 min

Every node keeps its own batch (BATCH samples) while nodes are added, on 100 Mbit/s links
(dist_sgd.scale.cluster's SCALING_RATE). In every node, alternated (medians), each strategy's
step: forward, loss, backward, its gradient sync, SGD update:

    average_gradients      lesson 06: one all-reduce per parameter, after backward
    our DDP, torch DDP     1 MiB buckets, all-reduced while backward runs
    our DDP + PowerSGD     our powerSGD_hook, rank 2, error feedback, on torch's default buckets
    local SGD (H = 8)      8 steps without communication, then one average of the weights
                           (one sample times all 8 steps; a step is an eighth)

What the CPU costs alone at each node count, and the cost model's two predictions of each
strategy (the link alone, and with this machine's CPU share): predict()'s docstring.
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
from dist_sgd.scale.summaries import cpu_share, nettrain_efficiency, nettrain_table

NAME = "nettrain"
KiB, MiB = 2 ** 10, 2 ** 20
BATCH, BUCKET_MB, PERIOD, RANK = 32, 1.0, 8, 2
STRATEGIES = ("average_gradients", "our DDP", "torch DDP", "our DDP + PowerSGD",
              f"local SGD (H = {PERIOD})")
ALONE = ("compute", "forward", "compute + PowerSGD arithmetic")
RATE = cluster.SCALING_RATE


def settings(quick):
    if quick:
        return {"nodes": (1, 2), "repeats": 3, "batch": 8}
    return {"nodes": (1, 2, 4, 8), "repeats": 10, "batch": BATCH}


def _steps(rank, world_size, batch):
    """{name: zero-argument step} for every strategy and every part measured alone."""
    import copy

    import torch.nn.functional as F

    from dist_sgd.bench.steps import batch as make_batch, build, make_step
    from dist_sgd.beyond.local_sgd import LocalSGD
    from dist_sgd.ddp import compress
    from dist_sgd.ddp.ddp import DistributedDataParallel
    from dist_sgd.ddp.grad_bucket import GradBucket

    model = build("bignet")
    model.eval()  # no dropout: the same arithmetic in every step
    x, y = make_batch(batch)
    steps = {"compute": make_step("single process", model, x, y),
             "average_gradients": make_step("average_gradients", model, x, y),
             "our DDP": make_step("our DDP", model, x, y, BUCKET_MB),
             "torch DDP": make_step("torch DDP", model, x, y, BUCKET_MB)}
    forward = steps["compute"].loss
    steps["forward"] = lambda: forward().item()

    def powersgd(group):
        return compress.PowerSGDState(group, matrix_approximation_rank=RANK, start_powerSGD_iter=2)

    # Our DDP + our PowerSGD on torch's default buckets (25 MiB, the first 1 MiB: after the
    # rebuild fc2 + fc1, then the convolutions). start_powerSGD_iter=2: the warm-up gets past it.
    wrapped = DistributedDataParallel(copy.deepcopy(model), bucket_cap_mb=None)
    wrapped.register_comm_hook(powersgd(None), compress.powerSGD_hook)
    steps["our DDP + PowerSGD"] = _plain_step(wrapped, x, y, F)

    # PowerSGD's arithmetic alone: the same hook on a group of this rank only.
    groups = [dist.new_group([r]) for r in range(world_size)]  # every rank makes every group
    alone = copy.deepcopy(model)
    state = powersgd(groups[rank])
    opt = torch.optim.SGD(alone.parameters(), lr=0.01)

    where = {id(p): i for i, p in enumerate(wrapped.module.parameters())}

    def compute_and_compress():  # on the buckets the wrapped model has at the time (rebuilt)
        opt.zero_grad()
        F.nll_loss(alone(x), y).backward()
        params = list(alone.parameters())
        for b in wrapped.buckets:
            bucket = GradBucket.of([params[where[id(p)]].grad for p in b.params], b.index)
            compress.powerSGD_hook(state, bucket).wait()
        opt.step()
    steps["compute + PowerSGD arithmetic"] = compute_and_compress

    local_model = copy.deepcopy(model)
    local_opt = torch.optim.SGD(local_model.parameters(), lr=0.01)
    local = LocalSGD(local_model.parameters(), period=PERIOD)

    def local_sgd():  # one period: PERIOD local steps, the first of which averages
        for _ in range(PERIOD):
            local_opt.zero_grad()
            F.nll_loss(local_model(x), y).backward()
            local_opt.step()
            local.step()
    steps[STRATEGIES[-1]] = local_sgd
    return steps, [p.numel() * 4 for p in model.parameters()]


def _sent(steps):
    """{strategy: the bytes of each all-reduce its step makes}, read after the timed steps,
    when every DDP has rebuilt its buckets: ours from its buckets, torch's from its own log,
    PowerSGD's three per bucket (plain tensors, P's, Q's: compress.values_sent)."""
    from dist_sgd.ddp.compress import values_sent

    logged = steps["torch DDP"].wrapped._get_ddp_logging_data()
    torchs = logged.get("rebuilt_bucket_sizes") or logged["bucket_sizes"]
    return {"our DDP": [b.flat.numel() * 4 for b in steps["our DDP"].wrapped.buckets],
            "torch DDP": [int(v) for v in str(torchs).replace(",", " ").split()],
            "our DDP + PowerSGD": [
                values * width for b in steps["our DDP + PowerSGD"].wrapped.buckets
                for values, width in values_sent([tuple(p.shape) for p in b.params],
                                                 "powerSGD", RANK)]}


def _plain_step(wrapped, x, y, F):
    opt = torch.optim.SGD(wrapped.parameters(), lr=0.01)

    def step():
        opt.zero_grad()
        F.nll_loss(wrapped(x), y).backward()
        wrapped.finish_gradient_synchronization()
        opt.step()
    step.wrapped = wrapped
    return step


def _node_work(rank, world_size, quick):
    from dist_sgd.comm.p2p import exchange_cpu, ping_pong

    s = settings(quick)
    out = {"nodes": world_size, "batch": s["batch"], "cores": os.cpu_count()}
    if world_size == 2:  # the links are alike at every node count: one fit, from 2 nodes
        out["ping-pong"] = ping_pong(list(costmodel.shaped_link_sizes(quick)), 5)
        out["cpu"] = exchange_cpu((64, 64 * KiB) + (() if quick else (MiB,)),
                                  0.2 if quick else 1.0, rounds=1 if quick else 3)
    steps, out["params"] = _steps(rank, world_size, s["batch"])
    samples = time_alternating(steps, s["repeats"], warmup=3)
    out["sent"] = _sent(steps)
    samples[STRATEGIES[-1]] = [t / PERIOD for t in samples[STRATEGIES[-1]]]
    out["steps"] = samples
    if rank == 0:
        print(f"  {world_size} node(s): " + ", ".join(
            f"{n} {summarize(v)['median'] * 1e3:.0f} ms" for n, v in samples.items()), flush=True)
    dist.barrier()  # torch's reducer finishes before anyone tears the group down
    return out


def _rows(out):
    p, rows = out["nodes"], []
    for r in out.get("ping-pong", []):
        rows.append({"part": "ping-pong", "nodes": p, "name": "one way", "bytes": r["bytes"],
                     "seconds": r["seconds"], "min": r["min"], "max": r["max"], "batch": "",
                     "detail": ""})
    for r in out.get("cpu", []):  # seconds: CPU seconds per message (every core's busy time)
        rows.append({"part": "cpu", "nodes": p, "name": "exchange", "bytes": r["bytes"],
                     "seconds": r["seconds"], "min": r["min"], "max": r["max"], "batch": "",
                     "detail": "", "cores": out["cores"]})
    for name, samples in out["steps"].items():
        s = summarize(samples)
        part = "alone" if name in ALONE else "step"
        detail = {"average_gradients": out["params"], STRATEGIES[-1]: [sum(out["params"])],
                  **out["sent"]}.get(name, "")
        rows.append({"part": part, "nodes": p, "name": name, "bytes": sum(detail) if detail else "",
                     "seconds": s["median"], "min": s["min"], "max": s["max"],
                     "batch": out["batch"], "detail": " ".join(map(str, detail))})
    return rows


def fit(rows):
    return costmodel.fit_shaped_link([r for r in rows if r["part"] == "ping-pong"])


def _messages(row):
    return [int(v) for v in str(row["detail"]).split()] if row["detail"] != "" else []


def predict(rows, alpha, beta, cpu=None):
    """{(name, nodes): predicted seconds per step} from the measured parts alone; cpu: None
    (the link alone) or this machine's share of a message (costmodel.predict_all_reduce).

    and, measured alone at the same node count, what the CPU costs: the step with no
    communication ("compute"), its forward pass, and the step plus PowerSGD's own arithmetic
    (its all-reduces on a group of one rank, so nothing crosses a link). The nodes share this
    machine's cores, so compute at p nodes is slower than at one: that slowdown is the CPU's,
    not the network's, and every number below keeps the two apart.

    The model (dist_sgd.scale.costmodel, alpha and beta fitted to a ping-pong between the nodes
    of the 2-node cluster, never to the steps) gets the measured compute and predicts, twice:
    with the link alone (`model_link`) and with this machine's CPU share of every message
    (`model`: the CPU seconds a message costs, measured alone in the 2-node cluster by
    dist_sgd.comm.p2p.exchange_cpu, and p ranks taking turns on its cores):

        average_gradients   compute + the all-reduce of every parameter, one after another
        DDPs                forward + max(backward, the all-reduce of every bucket)
        PowerSGD            compute with PowerSGD's arithmetic + for each bucket, one after the
                            other: max(its plain tensors, its P's) + its Q's (the hook starts the
                            first two together; gloo runs them on two threads)
        local SGD           compute + one all-reduce of the weights / 8

    Every bucket is read after the timed steps: the layout a DDP rebuilds after its first backward
    (BigNet: fc2 and fc1 together, then the convolutions), not the single bucket it starts with.
    """
    alone = {(r["name"], r["nodes"]): r["seconds"] for r in rows if r["part"] == "alone"}
    out = {}
    for r in rows:
        if r["part"] != "step":
            continue
        p, name = r["nodes"], r["name"]

        def comm(sizes):
            return sum(costmodel.predict_all_reduce("ring", n, p, alpha, beta, cpu=cpu)
                       for n in sizes)
        compute, forward = alone["compute", p], alone["forward", p]
        if name == "average_gradients":
            out[name, p] = compute + comm(_messages(r))
        elif name in ("our DDP", "torch DDP"):
            out[name, p] = forward + max(compute - forward, comm(_messages(r)))
        elif name == "our DDP + PowerSGD":  # three per bucket: plain tensors, P's, Q's
            sent = _messages(r)
            out[name, p] = alone["compute + PowerSGD arithmetic", p] + sum(
                max(comm([plain]), comm([ps])) + comm([qs])
                for plain, ps, qs in zip(sent[0::3], sent[1::3], sent[2::3]))
        else:  # local SGD: one average of the weights per PERIOD steps
            out[name, p] = compute + comm(_messages(r)) / PERIOD
    return out


def with_model(rows):
    alpha, beta = fit(rows)
    pred, link = predict(rows, alpha, beta, cpu_share(rows)), predict(rows, alpha, beta)
    for r in rows:
        r["model"] = pred.get((r["name"], r["nodes"]), "")
        r["model_link"] = link.get((r["name"], r["nodes"]), "")
    return rows


def measure(quick=False):
    rows = []
    for p in settings(quick)["nodes"]:
        print(f"  {p} node(s) at {RATE}/s per link", flush=True)
        rows += _rows(nodes.on_nodes(__name__, p, quick))
    rows = with_model(rows)
    write_csv(NAME, rows, f"{machine_facts()}, {RATE}/s links (tbf, {cluster.SCALING_BURST} B "
                          f"bucket, TCP {netns.CONGESTION_CONTROL}) between network-namespace "
                          "nodes")
    return rows


def report(rows):
    rows = with_model(rows)  # from the fit of these rows (a CSV's model column may be older)
    alpha, beta = fit(rows)
    rate = cluster.link_goodput(cluster.parse_rate(RATE))
    print(f"ping-pong: alpha = {alpha * 1e6:.0f} us, 1/beta = {8 / beta / 1e6:.1f} Mbit/s "
          f"(TCP's ceiling on this link: {8 * rate / 1e6:.1f})")
    cpu = cpu_share(rows)
    if cpu is not None:
        print(f"CPU per message (2 nodes swapping): {cpu[0] * 1e6:.0f} us + {cpu[1] * 1e9:.2f} "
              f"ns per byte; {cpu[2]} cores")
    t, eff = nettrain_table(rows), nettrain_efficiency(rows)
    ps = sorted({p for _, p in t})
    batch = t["compute", 1]["batch"]
    print(f"BigNet, {batch} samples per node; median ms per step (model: link + CPU | link "
          "alone), efficiency vs one node")
    print(f"  {'':32s}" + "".join(f"{f'{p} node(s)':>30s}" for p in ps))
    for name in ALONE:
        print(f"  {name + ' (alone)':32s}" + "".join(f"{t[name, p]['seconds'] * 1e3:30.1f}"
                                                    for p in ps))
    print(f"  {'CPU share (compute 1 / compute p)':32s}" + "".join(
        f"{eff['our DDP', p][1]:30.0%}" for p in ps))
    for name in STRATEGIES:
        print(f"  {name:32s}" + "".join(
            f"{t[name, p]['seconds'] * 1e3:9.1f} ({t[name, p]['model'] * 1e3:6.1f} |"
            f"{t[name, p]['model_link'] * 1e3:6.1f}) {eff[name, p][0]:5.0%}" for p in ps))
    for m, words in (("model", "link + CPU"), ("model_link", "link alone")):
        worst = max((abs(t[k][m] / t[k]["seconds"] - 1), k) for k in t if t[k]["part"] == "step")
        print(f"model ({words}) vs measured step, every strategy at 1-{ps[-1]} nodes: worst "
              f"{worst[0]:.1%} ({worst[1][0]}, {worst[1][1]} nodes)")
        for name in STRATEGIES:
            e = max(abs(t[name, p][m] / t[name, p]["seconds"] - 1) for p in ps)
            print(f"  {name:24s} worst {e:5.1%}")


def draw():
    if (measured := measured_as_root(NAME)) is None:
        return []
    rows, facts = measured
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    from dist_sgd.bench import plots  # matplotlib: only where we draw

    rows = with_model(rows)
    t, eff = nettrain_table(rows), nettrain_efficiency(rows)
    ps = sorted({p for _, p in t})
    batch = t["compute", 1]["batch"]
    colors = dict(zip(STRATEGIES, ("tab:orange", "tab:blue", "tab:red", "tab:purple", "tab:green")))
    fig, axes = plots.figure(3, width=5.4, height=4.4)
    ax_tp, ax_eff, ax_bar = axes[0]
    for name in STRATEGIES:
        meas = [batch * p / t[name, p]["seconds"] for p in ps]
        model = [batch * p / t[name, p]["model"] for p in ps]
        ax_tp.plot(ps, meas, "o-", color=colors[name], label=name)
        ax_tp.plot(ps, model, "--", lw=1, color=colors[name])
        ax_tp.plot(ps, [batch * p / t[name, p]["model_link"] for p in ps], ":", lw=1,
                   color=colors[name])
        ax_eff.plot(ps, [eff[name, p][0] for p in ps], "o-", color=colors[name], label=name)
        ax_eff.plot(ps, [t["compute", 1]["seconds"] / t[name, p]["model"] for p in ps], "--",
                    lw=1, color=colors[name])
    ax_tp.plot(ps, [batch * p / t["compute", p]["seconds"] for p in ps], "k:",
               label="compute alone (what the 2 cores allow)")
    ax_tp.plot(ps, [batch * p / t["compute", 1]["seconds"] for p in ps], color="gray", lw=3,
               alpha=0.4, label="ideal: p x one node")
    ax_tp.plot([], [], "k--", lw=1, label="model given the compute: link + this machine's CPU")
    ax_tp.plot([], [], "k:", lw=1, label="model given the compute: link alone")
    ax_eff.plot(ps, [eff["our DDP", p][1] for p in ps], "k:",
                label="CPU share: compute at 1 node / at p")
    for ax in (ax_tp, ax_eff):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ps)
        ax.set_xticklabels([str(p) for p in ps])
        ax.set_xlabel("nodes")
        ax.grid(True, which="both", alpha=0.3)
    ax_tp.set_yscale("log")
    ax_tp.set_ylabel("samples / s, all nodes")
    ax_tp.set_title(f"throughput, {batch} samples per node", fontsize=10)
    ax_tp.legend(fontsize=6.5)
    ax_eff.set_ylim(0, 1.1)
    ax_eff.set_ylabel("efficiency: per-node samples/s vs one node alone")
    ax_eff.set_title("weak-scaling efficiency", fontsize=10)
    ax_eff.legend(fontsize=6.5)
    width = 0.8 / len(STRATEGIES)
    for i, name in enumerate(STRATEGIES):
        x = [j + (i - 2) * width for j in range(len(ps))]
        compute = [t["compute", p]["seconds"] * 1e3 for p in ps]
        step = [t[name, p]["seconds"] * 1e3 for p in ps]
        ax_bar.bar(x, compute, width, color="lightgray", edgecolor=colors[name])
        ax_bar.bar(x, [max(0.0, s - c) for s, c in zip(step, compute)], width, bottom=compute,
                   color=colors[name], label=name)
        ax_bar.plot(x, [t[name, p]["model"] * 1e3 for p in ps], "D", ms=3, color="black",
                    label="_model")
    handles, _ = ax_bar.get_legend_handles_labels()
    handles += [Patch(color="lightgray", label="compute alone (at that node count)"),
                Line2D([], [], marker="D", ms=3, ls="", color="black", label="model")]
    ax_bar.set_xticks(range(len(ps)))
    ax_bar.set_xticklabels([f"{p} node(s)" for p in ps])
    ax_bar.set_yscale("log")
    ax_bar.set_ylabel("ms per step (colour: beyond compute)")
    ax_bar.set_title("where a step goes", fontsize=10)
    ax_bar.legend(handles=handles, fontsize=6.5)
    title = f"Weak scaling of BigNet on 1-{ps[-1]} emulated nodes, {RATE}/s links"
    return [plots.finish(fig, NAME, title, facts,
                         note="medians of alternated steps; DDPs with 1 MiB buckets; PowerSGD "
                              f"rank {RANK} with error feedback on torch's default buckets; "
                              "model: alpha-beta from the ping-pong plus the compute measured at "
                              "each node count, with (dashed, diamonds) and without (dotted) the "
                              "CPU each message costs")]


if __name__ == "__main__":
    nodes.node_main(_node_work, sys.argv[1:])
