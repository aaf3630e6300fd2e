"""Data, tensor and pipeline parallelism on the same model, on 2 and 4 emulated nodes.

    sudo python3 -m dist_sgd.bench modelpar     # needs root (network namespaces); ~4 min

The model: BLOCKS residual MLP blocks x + fc2(gelu(fc1(x))) of width WIDTH (hidden 4 x WIDTH),
float32, a global batch of BATCH rows, SGD. In every node, alternated (medians), one step:

    data parallel      each node BATCH / p rows, the gradients all-reduced (ours, one flat
                       buffer): 2(p-1)/p x the parameters' bytes per node
    tensor parallel    every block's fc1 column-parallel, fc2 row-parallel (lesson 20): each
                       node all rows, 1/p of every weight, an all-reduce of the activations
                       per block forward and one backward
    pipeline (GPipe)   BLOCKS / p blocks per node, MICRO micro-batches (lesson 19): the
                       activations cross the stage boundaries only
"""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

from dist_sgd.bench import nodes
from dist_sgd.bench.common import measured_as_root
from dist_sgd.plumbing.figures import machine_facts, write_csv
from dist_sgd.plumbing.timing import summarize, time_alternating
from dist_sgd.scale import costmodel

NAME = "modelpar"
RATE = "1gbit"
STRATEGIES = ("data", "tensor", "pipeline")
BLOCKS, MICRO = 4, 4


def settings(quick):
    if quick:
        return {"nodes": (2,), "repeats": 3, "width": 64, "batch": 64}
    return {"nodes": (2, 4), "repeats": 8, "width": 256, "batch": 256}


class Block(nn.Module):
    def __init__(self, width, fc1=None, fc2=None):
        super().__init__()
        self.fc1 = fc1 or nn.Linear(width, 4 * width)
        self.fc2 = fc2 or nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(x)))


def _model(width):
    torch.manual_seed(0)
    return nn.Sequential(*[Block(width) for _ in range(BLOCKS)])


def _steps(rank, p, width, batch):
    """{strategy: zero-argument step}, and the tensor-parallel all-reduces' log."""
    from dist_sgd.comm.collectives import all_reduce
    from dist_sgd.parallel import pipeline as P
    from dist_sgd.parallel.tensor import ColumnParallelLinear, RowParallelLinear

    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(batch, width, generator=g), torch.randn(batch, width, generator=g)
    steps, log = {}, []

    dp = _model(width)
    dp_opt, mine = torch.optim.SGD(dp.parameters(), lr=0.01), slice(rank * batch // p,
                                                                     (rank + 1) * batch // p)

    def data():
        dp_opt.zero_grad()
        F.mse_loss(dp(x[mine]), y[mine]).backward()
        flat = torch.cat([q.grad.flatten() for q in dp.parameters()])
        all_reduce(flat)
        flat /= p
        torch.nn.utils.vector_to_parameters(flat, [q.grad for q in dp.parameters()])
        dp_opt.step()
    steps["data"] = data

    tp = nn.Sequential(*[Block(width, ColumnParallelLinear.from_linear(b.fc1, False, log=log),
                               RowParallelLinear.from_linear(b.fc2, True, log=log))
                         for b in _model(width)])
    tp_opt = torch.optim.SGD(tp.parameters(), lr=0.01)

    xt = x.clone().requires_grad_()  # as from an earlier layer: f's backward runs too

    def tensor():
        tp_opt.zero_grad()
        F.mse_loss(tp(xt), y).backward()
        tp_opt.step()
    steps["tensor"] = tensor

    stage = P.split_stages(_model(width), p)[rank]
    sched = P.ScheduleGPipe(P.PipelineStage(stage, rank, p, "cpu"), MICRO, F.mse_loss)
    pp_opt = torch.optim.SGD(stage.parameters(), lr=0.01)

    def pipeline():
        pp_opt.zero_grad()
        sched.step(*([x] if rank == 0 else []), **({"target": y} if rank == p - 1
                                                             else {}))
        pp_opt.step()
    steps["pipeline"] = pipeline
    held = {"data": dp, "tensor": tp, "pipeline": stage}
    state = {k: sum(q.numel() * q.element_size() for q in m.parameters()) for k, m in held.items()}
    return steps, log, state


def _node_work(rank, world_size, quick):
    import torch.distributed as dist

    s = settings(quick)
    steps, log, state = _steps(rank, world_size, s["width"], s["batch"])
    samples = time_alternating(steps, s["repeats"], warmup=2)
    per_step = log[:len(log) // (s["repeats"] + 2)]  # one step's all-reduces
    params = sum(q.numel() for q in _model(s["width"]).parameters())
    rows = []
    for name in STRATEGIES:
        m = summarize(samples[name])
        sent = costmodel.parallel_bytes(name, params, BLOCKS, s["batch"] * s["width"],
                                        world_size, allreduces=2)  # MLP blocks: f and g
        counted = sum(2 * (world_size - 1) / world_size * e["bytes"] for e in per_step) \
            if name == "tensor" else ""
        rows.append({"strategy": name, "nodes": world_size, "seconds": m["median"],
                     "min": m["min"], "max": m["max"], "bytes": sent, "counted": counted,
                     "state_bytes": state[name], "params": params, "width": s["width"],
                     "batch": s["batch"]})
    if rank == 0:
        print(f"  {world_size} nodes: " + ", ".join(
            f"{r['strategy']} {r['seconds'] * 1e3:.0f} ms" for r in rows), flush=True)
    dist.barrier()
    return rows


def measure(quick=False):
    rows = []
    for p in settings(quick)["nodes"]:
        print(f"  {p} nodes at {RATE}/s per link", flush=True)
        rows += nodes.on_nodes(__name__, p, quick, rate=RATE)
    write_csv(NAME, rows, f"{machine_facts()}, {RATE}/s links (tbf) between network-namespace "
                          "nodes")
    return rows


def report(rows):
    """The rows, printed. The links: RATE each way (tbf). Each row holds the seconds per step,
    the bytes a node sends per step (dist_sgd.scale.costmodel.parallel_bytes; tensor parallel's
    also counted from its all-reduces) and the bytes of model state a node holds (counted).
    Which wins: data parallel sends the most (the whole model's gradients), the pipeline the
    least, paying in idle stages; tensor parallelism's bytes grow with the batch, not the model,
    and it talks inside every layer.
    """
    print(f"{BLOCKS} MLP blocks, width {rows[0]['width']}, {rows[0]['params']:,} parameters, "
          f"batch {rows[0]['batch']}; per node and step:")
    print(f"  {'strategy':10s}{'nodes':>6s}{'ms':>9s}{'KiB sent':>12s}{'KiB counted':>13s}"
          f"{'KiB of state':>14s}")
    for r in rows:
        counted = f"{float(r['counted']) / 1024:13.0f}" if r["counted"] != "" else f"{'':13s}"
        print(f"  {r['strategy']:10s}{int(r['nodes']):6d}{float(r['seconds']) * 1e3:9.1f}"
              f"{float(r['bytes']) / 1024:12.0f}{counted}{float(r['state_bytes']) / 1024:14.0f}")


def draw():
    if (measured := measured_as_root(NAME)) is None:
        return []
    rows, facts = measured
    from dist_sgd.bench import plots  # matplotlib: only where we draw

    fig, axes = plots.figure(3, width=4.6, height=3.8)
    ps = sorted({int(r["nodes"]) for r in rows})
    for name, colour in zip(STRATEGIES, ("tab:blue", "tab:orange", "tab:green")):
        mine = sorted((r for r in rows if r["strategy"] == name), key=lambda r: int(r["nodes"]))
        for ax, key, scale in zip(axes[0], ("seconds", "bytes", "state_bytes"),
                                  (1e3, 1 / 1024, 1 / 1024)):
            ax.plot(ps, [float(r[key]) * scale for r in mine], "o-", color=colour, label=name)
    for ax, label in zip(axes[0], ("ms per step", "KiB each node sends per step",
                                   "KiB of parameters each node holds")):
        ax.set_xticks(ps)
        ax.set_xlabel("nodes")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][1].set_yscale("log")
    return [plots.finish(fig, NAME, f"Data, tensor and pipeline parallelism, {RATE}/s links",
                         facts, note=f"{BLOCKS} residual MLP blocks; medians of alternated "
                                     f"steps; pipeline: GPipe, {MICRO} micro-batches")]


if __name__ == "__main__":
    nodes.node_main(_node_work, sys.argv[1:])
