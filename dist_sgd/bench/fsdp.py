"""Lesson 16's figure: what FSDP holds and sends per rank, and its step on a real link.

    python -m dist_sgd.bench fsdp       # part 2 needs root (network namespaces); else skipped

Part 1, one host (gloo), world sizes 1-4: 12 x Linear(384, 384) (1.77 M float32 parameters,
every size divisible by 1-4, every parameter sharded as torch's fully_shard does) and Adam.
Counted tensor by tensor on every rank, after a step: parameters, gradients, Adam's state,
and the most gathered buffers held at once during the step, for DDP, ZeRO-1, ZeRO-2 and
ZeRO-3, next to the ZeRO paper's formulas; and the bytes each sends per step, counted from
the collectives it issued, over DDP's.

Part 2 (root): a training step of BigNet on two emulated nodes, every candidate alternated:
_link_worker()'s docstring.
"""
import os
import pickle
import sys
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F

from dist_sgd.bench import nodes
from dist_sgd.plumbing.figures import machine_facts, read_csv, write_csv
from dist_sgd.plumbing.launch import launch
from dist_sgd.plumbing.timing import summarize, time_alternating
from dist_sgd.scale import cluster, netns

NAME = "fsdp"
WORLD_SIZES = (1, 2, 3, 4)
WIDTH, DEPTH, BATCH = 384, 12, 8  # part 1
NODES, RATE = 2, "1gbit"  # part 2: lesson 11's nodes
NODE_BATCHES = (16, 64)  # samples per node: communication-bound, then more compute to hide it
SCHEMES = ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3")
LINK = ("no communication", "torch DDP", "our DDP", "ZeRO-1", "ZeRO-3, no prefetch", "ZeRO-3",
        "ZeRO-2", "ZeRO-3, torch's collectives", "torch fully_shard ZeRO-3",
        "torch fully_shard ZeRO-2")
CAPTION = ("Top: 12 x Linear(384, 384), Adam, float32: bytes per rank (parameters, gradients, "
           "Adam's state, gathered buffers), counted tensor by tensor at the peak of a step, next "
           "to the ZeRO paper's formulas (+ the gathered layers), and bytes sent per step, counted "
           "from the collectives, over DDP's.\nBottom: one BigNet training step on 2 emulated "
           "nodes at 1 Gbit/s, every candidate alternated in one run; ours use our collectives "
           "unless named.")


# ---- part 1: memory and bytes, one host -----------------------------------------------------

def _layers():
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(DEPTH)])


def _nbytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


def _state(opt):
    return _nbytes(v for s in opt.state.values() for v in s.values() if torch.is_tensor(v))


def _memory_worker(rank, world_size):
    from dist_sgd.ddp.ddp import DistributedDataParallel
    from dist_sgd.shard.fsdp import FullyShardedDataParallel
    from dist_sgd.comm.counted import Counted
    from dist_sgd.shard.zero import ShardedOptimizer

    x = torch.randn(BATCH, WIDTH, generator=torch.Generator().manual_seed(rank))
    rows, counted = [], Counted("torch")
    for scheme in SCHEMES:
        model = _layers()
        if scheme == "DDP":
            net = DistributedDataParallel(
                model, all_reduce=lambda t: counted.start("all_reduce", t).wait())
            opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        elif scheme == "ZeRO-1":
            net = model
            opt = ShardedOptimizer(model.parameters(), torch.optim.Adam, scheme="all_gather",
                                   lr=1e-3)
        else:
            net = FullyShardedDataParallel(model, shard_all=True,
                                           reshard_after_forward=scheme == "ZeRO-3")
            opt = torch.optim.Adam(net.parameters(), lr=1e-3)
        for _ in range(2):  # the second step knows the order of units (prefetch)
            counted.log.clear()
            opt.zero_grad(set_to_none=False)
            F.mse_loss(net(x), x).backward()
            opt.step()
        params = list(net.parameters())
        row = {"part": "memory", "world_size": world_size, "rank": rank, "scheme": scheme,
               "parameters": sum(p.numel() for p in _layers().parameters()),
               "params": _nbytes(params), "grads": _nbytes(p.grad for p in params),
               "state": _state(opt), "buffers": 0, "unit_bytes": WIDTH * (WIDTH + 1) * 4}
        if scheme == "DDP":
            row["sent"] = counted.bytes_sent(world_size)
            net.remove_hooks()
        elif scheme == "ZeRO-1":
            row["sent"] = opt.bytes_per_step()
        else:
            row["buffers"], row["sent"] = net.memory()["peak_buffers"], net.bytes_per_step()
        rows.append(row)
    torch.distributed.barrier()  # our DDP's last reduction done everywhere before teardown
    return rows


def formula(scheme, psi, p, unit):
    """The ZeRO paper's bytes per rank (float32 + Adam: K = 8), plus what ours holds besides
    (named): ZeRO-3 two gathered units and one unit's gradient being reduced; ZeRO-2, whose
    formula counts the gathered units as its parameters, its own pieces (4/p) on top."""
    return {"DDP": 16 * psi, "ZeRO-1": (8 + 8 / p) * psi,
            "ZeRO-2": (4 + 12 / p) * psi + 4 * psi / p, "ZeRO-3": 16 * psi / p + 3 * unit}[scheme]


# ---- part 2: one step on two emulated nodes -------------------------------------------------

def _link_models():
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as TorchDDP

    from dist_sgd.ddp.ddp import DistributedDataParallel
    from dist_sgd.sgd.models import BigNet
    from dist_sgd.shard.fsdp import FullyShardedDataParallel
    from dist_sgd.shard.zero import ShardedOptimizer

    def bignet():
        torch.manual_seed(0)
        return BigNet().eval()  # no dropout: every candidate computes the same gradients

    def torch_fsdp(reshard):
        model = bignet()
        for layer in (model.conv1, model.conv2, model.fc1, model.fc2):
            fully_shard(layer, reshard_after_forward=reshard)
        return fully_shard(model, reshard_after_forward=reshard)

    nets = {"no communication": bignet(), "torch DDP": TorchDDP(bignet(), bucket_cap_mb=1),
            "our DDP": DistributedDataParallel(bignet(), bucket_cap_mb=1), "ZeRO-1": bignet(),
            "ZeRO-3, no prefetch": FullyShardedDataParallel(bignet(), prefetch=0,
                                                            collectives="ours"),
            "ZeRO-3": FullyShardedDataParallel(bignet(), collectives="ours"),
            "ZeRO-2": FullyShardedDataParallel(bignet(), reshard_after_forward=False,
                                               collectives="ours"),
            "ZeRO-3, torch's collectives": FullyShardedDataParallel(bignet()),
            "torch fully_shard ZeRO-3": torch_fsdp(True),
            "torch fully_shard ZeRO-2": torch_fsdp(False)}
    opts = {n: torch.optim.Adam(m.parameters(), lr=1e-3) for n, m in nets.items() if n != "ZeRO-1"}
    opts["ZeRO-1"] = ShardedOptimizer(nets["ZeRO-1"].parameters(), torch.optim.Adam,
                                      scheme="all_gather", collectives="ours", lr=1e-3)
    return nets, opts


def _full(model):
    if hasattr(model, "gather_full_params"):
        return model.gather_full_params()
    inner = getattr(model, "module", model)  # torch DDP / ours hold the module
    return {n: p.full_tensor() if hasattr(p, "full_tensor") else p.detach()
            for n, p in inner.named_parameters()}


def _link_worker(rank, world_size, quick):
    """One node's part of the link measurement.

    Part 2, two emulated nodes (dist_sgd.scale.cluster) on a 1 Gbit/s link, one rank each: a
    training step of BigNet (forward, backward, Adam) with 16 samples per node (its 4.8 MB of
    parameters take longer on the wire than its computation) and with 64 (four times the
    computation to hide the wire behind); every candidate alternated in one run, medians of the
    slowest rank: no communication, torch DDP, our DDP, ZeRO-1, our ZeRO-3 with and without
    prefetch and with torch's collectives, our ZeRO-2, torch's fully_shard both ways (each layer
    and the root wrapped). Our ZeRO-1/2/3 use our collectives unless named. After the timed
    steps every candidate has taken as many steps from the same start on the same data: its
    weights are compared with torch DDP's.
    """
    from dist_sgd.plumbing.check import max_diff
    from dist_sgd.comm.counted import wire_bytes

    gen = torch.Generator().manual_seed(rank)
    nets, opts = _link_models()

    def step(name, x, y):
        opts[name].zero_grad(set_to_none=True)
        F.nll_loss(nets[name](x), y).backward()
        opts[name].step()

    times = {}
    for batch in NODE_BATCHES:
        x = torch.randn(batch, 1, 28, 28, generator=gen)
        y = torch.randint(0, 10, (batch,), generator=gen)
        samples = time_alternating({n: (lambda n=n: step(n, x, y)) for n in LINK},
                                   repeats=4 if quick else 25 if batch < 32 else 15)
        times.update({(batch, n): v for n, v in samples.items()})
    sent = {n: nets[n].bytes_per_step() for n in LINK if hasattr(nets[n], "bytes_per_step")}
    sent["ZeRO-1"] = opts["ZeRO-1"].bytes_per_step()
    grads = 4 * sum(p.numel() for p in nets["no communication"].parameters())
    sent["our DDP"] = sent["torch DDP"] = wire_bytes("all_reduce", grads, world_size)
    ref = _full(nets["torch DDP"])
    diffs = {}
    for n in LINK:
        full = _full(nets[n])
        diffs[n] = ("" if n == "no communication" else
                    max_diff([full[k] for k in ref], list(ref.values())))
    torch.distributed.barrier()  # DDPs' reducers done before the group goes
    return {"seconds": times, "sent": sent, "diffs": diffs}


def _link_rows(quick):
    problem = netns.privilege_problem()
    if problem:
        print(f"fsdp: the link part is skipped: {problem}")
        return []
    out_path = os.path.join(tempfile.mkdtemp(prefix="dist_sgd_fsdp_"), "link.pkl")
    with cluster.Cluster(NODES, rate=RATE) as c:
        cmd = ["env", "RANK=$NODE_RANK", "WORLD_SIZE=$NNODES", "OMP_NUM_THREADS=1", sys.executable,
               "-m", "dist_sgd.bench.fsdp", "--node", out_path] + (["--quick"] if quick else [])
        c.run(cmd, timeout=1800)
    with open(out_path, "rb") as f:
        out = pickle.load(f)
    rows = []
    for (batch, name), samples in out["seconds"].items():
        s = summarize(samples)
        rows.append({"part": "link", "batch": batch, "scheme": name, "seconds": s["median"],
                     "min": s["min"], "max": s["max"], "repeats": s["n"],
                     "sent": out["sent"].get(name, ""), "max_diff": out["diffs"][name]})
    return rows


def measure(quick=False):
    rows = []
    for p in WORLD_SIZES if not quick else (1, 2):
        for ranks in launch(_memory_worker, p, backend="gloo"):
            rows.extend(ranks)
    load = os.getloadavg()[0]
    rows += _link_rows(quick)
    facts = (f"{machine_facts()}; link part: {NODES} nodes (network namespaces) at "
             f"{RATE}/s each way, load average {load:.1f} at its start")
    write_csv(NAME, rows, facts)  # rows of several parts: write_csv takes every key
    return rows


# ---- report and figure ----------------------------------------------------------------------

def _memory(rows):
    """{(scheme, p): (largest total over ranks, formula)} in bytes."""
    out = {}
    for r in rows:
        if r["part"] == "memory":
            total = r["params"] + r["grads"] + r["state"] + r["buffers"]
            key = (r["scheme"], r["world_size"])
            f = formula(r["scheme"], r["parameters"], r["world_size"], r["unit_bytes"])
            out[key] = (max(total, out.get(key, (0,))[0]), f, r["sent"])
    return out


def report(rows):
    mem, MiB = _memory(rows), 2 ** 20
    sizes = sorted({p for _, p in mem})
    print("bytes per rank at the peak of a step (MiB, largest rank) / the formula (+ named units):")
    for scheme in SCHEMES:
        print(f"  {scheme:7s} " + "  ".join(
            f"p={p}: {mem[scheme, p][0] / MiB:6.2f} "
            f"({mem[scheme, p][0] / mem[scheme, p][1]:.3f}x)" for p in sizes))
    print("bytes sent per step over DDP's (counted):")
    for scheme in SCHEMES[1:]:
        print(f"  {scheme:7s} " + "  ".join(
            f"p={p}: {mem[scheme, p][2] / mem['DDP', p][2]:.4f}x"
            for p in sizes if mem["DDP", p][2]))
    for batch in sorted({r["batch"] for r in rows if r["part"] == "link"}):
        link = {r["scheme"]: r for r in rows if r["part"] == "link" and r["batch"] == batch}
        ms = {n: r["seconds"] * 1e3 for n, r in link.items()}
        print(f"BigNet step on {NODES} nodes at {RATE}/s ({batch} samples per node), median ms "
              f"of {link['ZeRO-3']['repeats']}:")
        for n, r in link.items():
            diff = f"  weights vs torch DDP {r['max_diff']:.1e}" if r["max_diff"] != "" else ""
            sent = f"  sends {r['sent'] / 2 ** 20:5.2f} MiB" if r["sent"] != "" else ""
            print(f"  {n:28s} {ms[n]:7.1f} ({ms[n] / ms['our DDP']:.2f}x our DDP){sent}{diff}")
        print(f"  prefetch makes ZeRO-3 {ms['ZeRO-3, no prefetch'] / ms['ZeRO-3']:.2f}x faster "
              f"; ZeRO-3 / our DDP {ms['ZeRO-3'] / ms['our DDP']:.2f}x; torch's fully_shard "
              f"ZeRO-3 / ours {ms['torch fully_shard ZeRO-3'] / ms['ZeRO-3']:.2f}x")


def draw():
    try:
        rows, facts = read_csv(NAME)
    except FileNotFoundError:
        print("fsdp: no fsdp.csv yet (python -m dist_sgd.bench fsdp, as root); nothing to draw")
        return []
    from dist_sgd.bench import plots  # matplotlib: only where we draw

    mem = _memory(rows)
    sizes = sorted({p for _, p in mem})
    batches = sorted({r["batch"] for r in rows if r["part"] == "link"})
    fig, axes = plots.figure(2, nrows=2 if batches else 1, width=6.5, height=4.6)
    ax_mem, ax_bytes = axes[0]
    colors = {"DDP": "tab:red", "ZeRO-1": "tab:orange", "ZeRO-2": "tab:green", "ZeRO-3": "tab:blue"}
    for scheme, c in colors.items():
        ax_mem.plot(sizes, [mem[scheme, p][0] / 2 ** 20 for p in sizes], "o-", color=c,
                    label=scheme)
        ax_mem.plot(sizes, [mem[scheme, p][1] / 2 ** 20 for p in sizes], "--", color=c, lw=0.8)
        if scheme != "DDP":
            ps = [p for p in sizes if mem["DDP", p][2]]
            ax_bytes.plot(ps, [mem[scheme, p][2] / mem["DDP", p][2] for p in ps], "o-", color=c,
                          label=scheme)
    ax_mem.set_ylim(bottom=0)
    ax_mem.set_xlabel("world size p")
    ax_mem.set_ylabel("MiB per rank (largest rank)")
    ax_mem.set_title("memory per rank: measured (o), formula (--)")
    ax_mem.legend(fontsize=8)
    ax_bytes.axhline(1.0, color="tab:red", lw=0.8, ls=":", label="DDP")
    ax_bytes.set_ylim(0, 1.8)
    ax_bytes.set_xlabel("world size p")
    ax_bytes.set_ylabel("bytes sent per step / DDP's")
    ax_bytes.set_title("bytes per step over DDP's, counted")
    ax_bytes.legend(fontsize=8)
    for ax in (ax_mem, ax_bytes):
        ax.set_xticks(sizes)
    for ax, batch in zip(axes[1] if batches else [], batches):
        link = [r for r in rows if r["part"] == "link" and r["batch"] == batch]
        y = list(range(len(link)))
        ax.barh(y, [r["seconds"] * 1e3 for r in link],
                color=["tab:red" if r["scheme"].startswith("torch") else "tab:blue" for r in link])
        ax.errorbar([r["seconds"] * 1e3 for r in link], y, fmt="none", color="black", lw=0.8,
                    xerr=[[(r["seconds"] - r["min"]) * 1e3 for r in link],
                          [(r["max"] - r["seconds"]) * 1e3 for r in link]])
        ax.set_yticks(y)
        ax.set_yticklabels([r["scheme"] for r in link])
        ax.invert_yaxis()
        ax.set_xlabel("ms per step (median, min-max; red: torch's)")
        ax.set_title(f"BigNet, {batch} samples per node, {NODES} nodes at 1 Gbit/s")
    return [plots.finish(fig, NAME, "FSDP: what each rank holds and sends, and its step on a link",
                         facts, note=CAPTION)]


if __name__ == "__main__":
    nodes.node_main(_link_worker, sys.argv[1:])
