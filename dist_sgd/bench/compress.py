"""Gradient compression (lesson 12): bytes per step, step time with our hooks vs torch's, and
the error-feedback residual over steps.

    python -m dist_sgd.bench compress      # compress.png, compress.csv, compress_residual.csv

1. Bytes per step: what each rank hands to all-reduce per step for BigNet (1.2 M parameters),
   counted by the hooks during the timed steps (PowerSGD: its state's counters), and checked
   against dist_sgd.ddp.compress.values_sent.
2. Step time: BigNet, 2 ranks over loopback, forward + backward (the hook runs inside) for
   none / fp16 / PowerSGD rank 1, 2, 4, with the same hook settings: torch's DDP + torch's
   hook, torch's DDP + our hook, our DDP + our hook (one bucket each: on torch's DDP, torch's
   powerSGD_hook can hang or abort on gloo with several), all alternated, medians of the
   slowest rank.
3. Residual: ||e|| / ||averaged gradient|| over the steps of Net trained on the dataset
   get_dataset("auto") picks, PowerSGD rank 1 with error feedback, from step START.

4. The link (root): measure_link()'s docstring.
"""
import os
import pickle
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.algorithms.ddp_comm_hooks.default_hooks as torch_default
import torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook as torch_powersgd
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from dist_sgd.bench.steps import ONE_BUCKET
from dist_sgd.ddp import compress
from dist_sgd.ddp.ddp import DistributedDataParallel
from dist_sgd.plumbing.figures import machine_facts, read_csv, write_csv
from dist_sgd.plumbing.launch import launch
from dist_sgd.plumbing.timing import summarize, time_alternating
from dist_sgd.scale import cluster
from dist_sgd.scale.costmodel import human_bytes
from dist_sgd.scale.summaries import COMPRESS_LINK, compress_link, compress_link_lines
from dist_sgd.sgd.models import BigNet, Net, init_weights

NAME = "compress"
SCHEMES = {"none": 0, "fp16": 0, "PowerSGD rank 1": 1, "PowerSGD rank 2": 2, "PowerSGD rank 4": 4}
START = 2          # PowerSGD's start_powerSGD_iter in the timed models (past it after warm-up)
RESIDUAL_START = 20


def settings(quick):
    return {"batch": 4 if quick else 16, "repeats": 3 if quick else 15,
            "residual_steps": 12 if quick else 300, "link_batch": 16,
            "link_repeats": 3 if quick else 15}


def _hook(scheme, ours):
    """(state, hook) for scheme, ours or torch's, with identical settings."""
    rank = SCHEMES[scheme]
    if rank:
        module = compress if ours else torch_powersgd
        return module.PowerSGDState(None, matrix_approximation_rank=rank,
                                    start_powerSGD_iter=START), module.powerSGD_hook
    module = compress if ours else torch_default
    return None, module.fp16_compress_hook if scheme == "fp16" else module.allreduce_hook


# What is timed: (DDP, our hook?). The target compares the first with the last.
IMPLS = {"torch DDP + torch hook": ("torch DDP", False),
         "torch DDP + our hook": ("torch DDP", True), "our DDP + our hook": ("our DDP", True)}


def _model(scheme, ours, ddp, bucket_cap_mb=ONE_BUCKET):
    torch.manual_seed(0)
    module = BigNet().apply(init_weights)
    cls = TorchDDP if ddp == "torch DDP" else DistributedDataParallel
    model = cls(module, bucket_cap_mb=bucket_cap_mb)  # default: one bucket (above 4.8 MB)
    state, hook = _hook(scheme, ours)
    counter = {"bytes": 0, "steps": 0}
    model.register_comm_hook(state, compress.counted(hook, counter, 2 if scheme == "fp16" else 4))
    return model, state, counter


def _residual(steps):
    """||e|| and ||averaged gradient|| per compressed step: Net, PowerSGD rank 1, error
    feedback."""
    from dist_sgd.sgd.data import get_dataset
    from dist_sgd.sgd.train import shard_loader

    torch.manual_seed(0)
    model = TorchDDP(Net().apply(init_weights), bucket_cap_mb=ONE_BUCKET)
    state = compress.PowerSGDState(None, matrix_approximation_rank=1,
                                   start_powerSGD_iter=RESIDUAL_START)
    model.register_comm_hook(state, compress.powerSGD_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.5)
    loader = shard_loader(get_dataset("auto", quiet=True), 64)
    out = []
    for step, (x, y) in zip(range(RESIDUAL_START + steps), loader):
        opt.zero_grad()
        F.nll_loss(model(x), y).backward()
        if state.error_dict:
            e = torch.cat(list(state.error_dict.values())).norm().item()
            g = torch.cat([p.grad.flatten() for p in model.parameters()]).norm().item()
            out.append({"step": step + 1, "error_norm": e, "grad_norm": g})
        opt.step()
    return out


def _step(model, x, y):
    return lambda: F.nll_loss(model(x), y).backward()


def _sent(scheme, state, counter):
    """Bytes per step into all-reduce, as counted since the counters were last reset."""
    if state is None:
        return counter["bytes"] / counter["steps"]
    return 4 * state.total_numel_after_compression / counter["steps"]


def _row(network, scheme, impl, world_size, batch, sent, samples):
    k = SCHEMES[scheme]
    shapes = [p.shape for p in BigNet().parameters()]
    paper = sum(v * w for v, w in compress.values_sent(shapes, "powerSGD" if k else scheme, k or 1))
    t = summarize(samples)
    return {"network": network, "scheme": scheme, "impl": impl, "world_size": world_size,
            "batch_per_rank": batch, "bytes_per_step": paper if sent is None else sent,
            "bytes_on_paper": paper, "median_s": t["median"], "min_s": t["min"], "max_s": t["max"],
            "n": t["n"]}


def _reset(state, counter):
    counter.update(bytes=0, steps=0)
    if state is not None:
        state.total_numel_after_compression = 0


LINK_IMPLS = {"torch DDP, no compression": "none",
              "our DDP + our PowerSGD rank 2": "PowerSGD rank 2",
              "our DDP + our PowerSGD rank 2, one bucket": "PowerSGD rank 2",
              "BigNet alone, no communication": "none"}  # the floor: what no compression can beat


def _link_worker(rank, world_size, s):
    """One rank per node: torch's DDP as it comes (no hook, default buckets: it overlaps) vs our
    DDP + our powerSGD_hook rank 2 (default buckets; one bucket), and BigNet alone, alternated."""
    torch.manual_seed(0)
    plain, alone = TorchDDP(BigNet().apply(init_weights)), BigNet().apply(init_weights)
    ours, state, counter = _model("PowerSGD rank 2", True, "our DDP", bucket_cap_mb=None)
    one, state1, counter1 = _model("PowerSGD rank 2", True, "our DDP")
    torch.manual_seed(rank)
    x, y = torch.randn(s["link_batch"], 1, 28, 28), torch.randint(0, 10, (s["link_batch"],))
    models = dict(zip(LINK_IMPLS, (plain, ours, one, alone)))
    for _ in range(START + 1):  # past start_powerSGD_iter: every timed step compresses
        for model in models.values():
            _step(model, x, y)()
    _reset(state, counter)
    _reset(state1, counter1)
    times = time_alternating({n: _step(m, x, y) for n, m in models.items()}, s["link_repeats"], 1)
    dist.barrier()  # torch's reducer finishes before anyone leaves the group
    # bytes into all-reduce per step; None: on paper (torch's DDP counts nothing)
    sent = [None, _sent("PowerSGD rank 2", state, counter),
            _sent("PowerSGD rank 2", state1, counter1), 0]
    return [_row(COMPRESS_LINK, LINK_IMPLS[n], n, world_size, s["link_batch"], b, times[n])
            for n, b in zip(models, sent)]


def _worker(rank, world_size, s):
    models = {}
    for scheme in SCHEMES:
        for impl, (ddp, ours) in IMPLS.items():
            models[scheme, impl] = _model(scheme, ours, ddp)
    torch.manual_seed(rank)
    x, y = torch.randn(s["batch"], 1, 28, 28), torch.randint(0, 10, (s["batch"],))

    for _ in range(START + 1):  # past start_powerSGD_iter: every timed step compresses
        for model, _, _ in models.values():
            _step(model, x, y)()
    for _, state, counter in models.values():
        _reset(state, counter)
    names = {(scheme, impl): f"{scheme}, {impl}" for scheme, impl in models}
    times = time_alternating({names[k]: _step(m, x, y) for k, (m, _, _) in models.items()},
                             s["repeats"], 1)
    rows = [_row("loopback", scheme, impl, world_size, s["batch"], _sent(scheme, state, counter),
                 times[names[scheme, impl]])
            for (scheme, impl), (_, state, counter) in models.items()]
    return rows, _residual(s["residual_steps"])


def measure_link(quick):
    """Rows of the link measurement, or [] (after saying why) where no cluster can be built.

    4. The link: BigNet on 2 nodes of lesson 11's cluster (dist_sgd.scale.cluster: network
       namespaces, each node behind a 1 Gbit/s tbf-shaped link), one rank per node: torch's DDP as
       it comes (no hook, default buckets) against our DDP + our powerSGD_hook rank 2 with error
       feedback, in torch's default buckets (BigNet: two, the first compressed and sent while
       backward goes on through the convolutions) and in one bucket (sent after backward), and
       BigNet alone (the floor: what no compression can beat), alternated, medians of the slowest
       rank. measure_link() runs `python -m dist_sgd.bench.compress OUT` in every node
       (cluster.run_in_nodes) and node 0 leaves its rows in OUT. Needs root; without it this part is
       skipped with the reason. Accuracy is not measured on the link: the arithmetic is the same as
       over loopback, where lesson 12 measures it (our DDP, our hooks, several buckets).
    """
    out = os.path.join(tempfile.mkdtemp(prefix="dist_sgd_compress_"), "rows.pkl")
    problem = cluster.run_in_nodes(["-m", "dist_sgd.bench.compress", out]
                                   + (["--quick"] if quick else []), timeout=900)
    if problem:
        print(f"compress: the {COMPRESS_LINK} part skipped: {problem}")
        return []
    with open(out, "rb") as f:
        return pickle.load(f)


def measure(quick=False):
    load = os.getloadavg()[0]  # a busy machine makes every time here slower and noisier
    rows, residual = launch(_worker, 2, settings(quick), backend="gloo")[0]
    rows += measure_link(quick)
    facts = f"{machine_facts()}, load average {load:.1f} -> {os.getloadavg()[0]:.1f}"
    write_csv(NAME, rows, facts)
    write_csv(NAME + "_residual", residual, facts)
    return rows


def _split(rows):
    """(loopback rows, link rows {impl: row}); CSVs from before the link part have no network."""
    link = compress_link(rows)
    return [r for r in rows if r.get("network", "loopback") == "loopback"], link


def report(rows):
    rows, link = _split(rows)
    by = {(r["scheme"], r["impl"]): r for r in rows}
    print(f"BigNet, {rows[0]['world_size']} ranks over loopback (gloo), "
          f"{rows[0]['batch_per_rank']} samples per rank, one bucket; medians of {rows[0]['n']} "
          "alternated steps (slowest rank)")
    print(f"  {'scheme':16s} {'bytes/step':>11s}" + "".join(f" {impl:>23s}" for impl in IMPLS)
          + "  ours/torch (our DDP + our hook vs torch DDP + torch hook)")
    ratios, hook_ratios = {}, {}
    for scheme in SCHEMES:
        ref = by[scheme, "torch DDP + torch hook"]["median_s"]
        ratios[scheme] = by[scheme, "our DDP + our hook"]["median_s"] / ref
        hook_ratios[scheme] = by[scheme, "torch DDP + our hook"]["median_s"] / ref
        sent = by[scheme, "our DDP + our hook"]["bytes_per_step"]
        print(f"  {scheme:16s} {human_bytes(sent):>11s}"
              + "".join(f" {by[scheme, impl]['median_s'] * 1e3:21.1f}ms" for impl in IMPLS)
              + f"  {ratios[scheme]:.2f}x")
        for impl in IMPLS:
            if by[scheme, impl]["bytes_per_step"] != by[scheme, impl]["bytes_on_paper"]:
                print(f"    {impl}: bytes counted {by[scheme, impl]['bytes_per_step']:.0f} differ "
                      "from dist_sgd.ddp.compress.values_sent "
                      f"{by[scheme, impl]['bytes_on_paper']:.0f}")
    print("  our DDP + our hook / torch DDP + torch's hook, same hook settings: "
          + ", ".join(f"{s} {r:.2f}x" for s, r in ratios.items()))
    print("  (our hook alone, on torch's DDP, / torch's hook: "
          + ", ".join(f"{s} {r:.2f}x" for s, r in hook_ratios.items()) + ")")
    p2 = (by["PowerSGD rank 2", "our DDP + our hook"]["median_s"]
          / by["none", "torch DDP + torch hook"]["median_s"])
    print("  our DDP + our PowerSGD rank 2 / torch DDP without compression, over loopback: "
          f"{p2:.2f}x")
    if link:
        print("\n".join(compress_link_lines(link)))
    else:
        print(f"{COMPRESS_LINK}: not measured (no cluster: needs root)")
    return ratios


def draw():
    from dist_sgd.bench import plots

    rows, facts = read_csv(NAME)
    residual, _ = read_csv(NAME + "_residual")
    report(rows)
    rows, link = _split(rows)
    by = {(r["scheme"], r["impl"]): r for r in rows}
    fig, axes = plots.figure(4 if link else 3, width=5.0)
    ax_b, ax_t, ax_r = axes[0][:3]
    names = list(SCHEMES)
    xs = range(len(names))
    sent = [by[s, "our DDP + our hook"]["bytes_per_step"] for s in names]
    ax_b.bar(xs, sent, color=["tab:gray", "tab:orange", "tab:blue", "tab:blue", "tab:blue"])
    for x, b in zip(xs, sent):
        ax_b.text(x, b, human_bytes(b), ha="center", va="bottom", fontsize=8)
    plots.bytes_axis(ax_b, "y")
    ax_b.set_xticks(list(xs), [n.replace("PowerSGD ", "PowerSGD\n") for n in names], fontsize=8)
    ax_b.set_ylabel("bytes per rank per step, into all-reduce")
    ax_b.set_title("BigNet: bytes each rank sends per step")

    width = 0.27
    colors = ("tab:red", "tab:purple", "tab:blue")
    for i, (impl, color) in enumerate(zip(IMPLS, colors)):
        med = [by[s, impl]["median_s"] * 1e3 for s in names]
        lo = [m - by[s, impl]["min_s"] * 1e3 for s, m in zip(names, med)]
        hi = [by[s, impl]["max_s"] * 1e3 - m for s, m in zip(names, med)]
        ax_t.bar([x + (i - 1) * width for x in xs], med, width, yerr=[lo, hi], capsize=2,
                 color=color, label=impl)
    ax_t.set_xticks(list(xs), [n.replace("PowerSGD ", "PowerSGD\n") for n in names], fontsize=8)
    ax_t.set_ylabel("ms per step (median, min-max)")
    ax_t.set_title(f"BigNet step, {rows[0]['world_size']} ranks, loopback")
    ax_t.legend(fontsize=8)

    steps = [r["step"] for r in residual]
    ax_r.plot(steps, [r["error_norm"] / r["grad_norm"] for r in residual], color="tab:blue",
              label="||e|| / ||averaged gradient||")
    ax_r.set_xlabel("training step (PowerSGD from step %d)" % (steps[0] if steps else 0))
    ax_r.set_ylabel("ratio")
    ax_r.set_title("error feedback: Net, PowerSGD rank 1")
    ax_r.legend(fontsize=8)
    if link:
        ax_l = axes[0][3]
        med = [r["median_s"] * 1e3 for r in link.values()]
        err = [[m - r["min_s"] * 1e3 for m, r in zip(med, link.values())],
               [r["max_s"] * 1e3 - m for m, r in zip(med, link.values())]]
        ax_l.bar(range(len(med)), med, yerr=err, capsize=3,
                 color=["tab:red", "tab:blue", "tab:cyan", "tab:gray"][:len(med)])
        for x, (m, r) in enumerate(zip(med, link.values())):
            ax_l.text(x, m / 2, f"{m:.0f} ms\n{human_bytes(r['bytes_per_step'])}/step", ha="center",
                      va="center", fontsize=9, color="white")
        ax_l.set_xticks(range(len(med)), [n.replace(", ", ",\n").replace(" + our P", "\n+ our P")
                                          .replace(" alone", "\nalone") for n in link], fontsize=7)
        ax_l.set_ylabel("ms per step (median, min-max)")
        ax_l.set_title(f"BigNet step, {COMPRESS_LINK}, "
                       f"{next(iter(link.values()))['batch_per_rank']} samples/node")
    return [plots.finish(fig, NAME, "Gradient compression as DDP communication hooks", facts,
                         note=f"batch {rows[0]['batch_per_rank']} per rank, {rows[0]['n']} "
                              "alternated samples per bar; e = what compression left on the rank "
                              "(error feedback)")]


if __name__ == "__main__":  # in each node of the cluster (see measure_link): one rank
    results = launch(_link_worker, None, settings("--quick" in sys.argv), backend="gloo")
    if results is not None:  # node 0: leave the rows for the parent
        with open(sys.argv[1], "wb") as f:
            pickle.dump(results[0], f)
