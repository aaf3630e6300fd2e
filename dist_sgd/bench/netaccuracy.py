"""Time to accuracy on a slow network: 4 emulated nodes, 10 Mbit/s links, Fashion-MNIST.

    sudo python3 -m dist_sgd.bench netaccuracy   # needs root (network namespaces); ~10 min

On 10 Mbit/s a synchronous step of Net (87 KB of gradients, ~10 ms of compute per node
here) waits ~0.1 s for its all-reduce: communication is most of the step. Four ways to train
the same model from the same start on the same data (each node its own quarter of every
global batch of 4 x 32, SGD lr 0.05 momentum 0.9 unless said otherwise, EPOCHS epochs):

    synchronous DDP        our DistributedDataParallel: every step all-reduces 87 KB
    PowerSGD               our DDP + our powerSGD_hook, rank 2, error feedback (one bucket;
                           plain all-reduce for the first START steps)
    local SGD (H = 4, 8)   every node steps alone, the weights are averaged every H steps
    DiLoCo (H = 24)        local steps of plain SGD (lr 0.1: the outer momentum takes the
                           place of the inner one), every 24 steps an outer Nesterov step (lr
                           0.7, momentum 0.9) along the average's move (Douillard et al. 2023)
"""
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from dist_sgd.bench import nodes
from dist_sgd.bench.common import Skip, measured_as_root
from dist_sgd.plumbing.figures import machine_facts, write_csv
from dist_sgd.scale import cluster, netns
from dist_sgd.scale.summaries import NETACCURACY_TARGET, netaccuracy_summary
from dist_sgd.sgd.data import LABELS, DatasetNotFound, get_dataset

NAME = "netaccuracy"
NODES, RATE = 4, "10mbit"
BATCH, LR, MOMENTUM, EPOCHS, START = 32, 0.05, 0.9, 2, 20
METHODS = ("synchronous DDP", "PowerSGD", "local SGD (H = 4)", "local SGD (H = 8)",
           "DiLoCo (H = 24)")
PERIODS = {"local SGD (H = 4)": 4, "local SGD (H = 8)": 8, "DiLoCo (H = 24)": 24}
INNER = {"DiLoCo (H = 24)": (0.1, 0.0)}  # (lr, momentum) of its inner SGD, else (LR, MOMENTUM)
EVAL_EVERY = 72  # a multiple of every period: the score is taken right after an average


def settings(quick):
    if quick:
        return {"steps": 48, "eval_every": 24, "test": 2000}
    return {"steps": None, "eval_every": EVAL_EVERY, "test": None}  # None: EPOCHS epochs


def _fresh(rank):
    from dist_sgd.sgd.models import Net, init_weights

    torch.manual_seed(0)
    model = Net()
    model.apply(init_weights)  # the same start on every node, for every method
    torch.manual_seed(1 + rank)  # each node its own dropout masks
    return model


def _wrap(method, model, p):
    """(the model to call, the LocalSGD averager or None, bytes per step function)."""
    from dist_sgd.beyond.local_sgd import LocalSGD
    from dist_sgd.ddp import compress
    from dist_sgd.ddp.ddp import DistributedDataParallel

    ring = 2 * (p - 1) / p  # what a ring all-reduce sends per node, per byte reduced
    n = sum(q.numel() * 4 for q in model.parameters())
    shapes = [tuple(q.shape) for q in model.parameters()]
    if method == "synchronous DDP":
        return DistributedDataParallel(model, bucket_cap_mb=None), None, lambda k: ring * n
    if method == "PowerSGD":
        ddp = DistributedDataParallel(model, bucket_cap_mb=None)
        ddp.register_comm_hook(compress.PowerSGDState(None, matrix_approximation_rank=2,
                                                      start_powerSGD_iter=START),
                               compress.powerSGD_hook)
        small = sum(v * w for v, w in compress.values_sent(shapes, "powerSGD", 2))
        return ddp, None, lambda k: ring * (n if k < START else small)
    from dist_sgd.sgd.sync import broadcast_parameters

    broadcast_parameters(model, src=0)
    period = PERIODS[method]
    outer = dict(outer_lr=0.7, outer_momentum=0.9, nesterov=True) if "DiLoCo" in method else {}
    # warmup_steps = period - 1: the averages follow steps period, 2 period, ... (not step 1)
    local = LocalSGD(model.parameters(), period=period, warmup_steps=period - 1, **outer)
    return model, local, lambda k: ring * n if (k + 1) % period == 0 else 0.0


def _train(method, rank, p, train, test, s):
    """One method's run on this node: its rows.

    Every EVAL_EVERY steps (a multiple of both periods, right after an average) the clock stops,
    the nodes score the model on the 10,000 test images together, and the clock goes on. Each
    method's wall time and bytes sent per node (a ring all-reduce sends 2(p-1)/p of what it
    reduces) to reach NETACCURACY_TARGET test accuracy (dist_sgd.plumbing.figures, where the
    summary lesson 10 quotes lives), and its accuracy after the last step, go into netaccuracy.csv.
    """
    from dist_sgd.sgd.train import evaluate

    model = _fresh(rank)
    net, local, sent = _wrap(method, model, p)
    lr, momentum = INNER.get(method, (LR, MOMENTUM))
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    images, labels = train.tensors
    per_epoch = len(images) // (BATCH * p)
    steps = s["steps"] or EPOCHS * per_epoch
    curve, clock, total = [], 0.0, 0.0
    dist.barrier()
    start = time.perf_counter()
    for k in range(steps):
        epoch, i = divmod(k, per_epoch)
        if i == 0:  # the same order on every node: a permutation per epoch
            order = torch.randperm(len(images), generator=torch.Generator().manual_seed(epoch))
        mine = order[(i * p + rank) * BATCH:(i * p + rank + 1) * BATCH]
        net.train()
        opt.zero_grad()
        F.nll_loss(net(images[mine]), labels[mine]).backward()
        getattr(net, "finish_gradient_synchronization", lambda: None)()
        opt.step()
        if local is not None:
            local.step()
        total += sent(k)
        if (k + 1) % s["eval_every"] == 0 or k + 1 == steps:
            clock += _slowest(time.perf_counter() - start)
            result = evaluate(model, test)
            curve.append({"step": k + 1, "seconds": clock, "bytes": total,
                          "accuracy": result["accuracy"], "loss": result["loss"]})
            if rank == 0:
                print(f"  {method:18s} step {k + 1:4d}: {clock:6.1f} s, "
                      f"{total / 1e6:6.1f} MB sent, test accuracy {result['accuracy']:.2%}",
                      flush=True)
            dist.barrier()
            start = time.perf_counter()
    dist.barrier()  # our DDP's and the hook's work ends everywhere before the next method
    return curve


def _slowest(seconds):
    """The slowest node's time (a step ends when its last node does)."""
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def dataset():
    """The name of the dataset to train on; says which and why.

    The data: Fashion-MNIST where its files are (`apt-get install dataset-fashion-mnist`, or
    DIST_SGD_FASHION_MNIST), else what the lessons use, get_dataset("auto") (MNIST if it can be
    downloaded, else a synthetic set), which says which; DIST_SGD_DATASET chooses one.
    """
    if os.environ.get("DIST_SGD_DATASET", "auto") == "auto":
        try:
            return get_dataset("fashion-mnist").name
        except DatasetNotFound as e:
            print(f"netaccuracy: {e}; the lessons' dataset instead", flush=True)
    return get_dataset("auto").name


def _node_work(rank, world_size, quick, data):
    s = settings(quick)
    train = get_dataset(data, quiet=True)
    test = get_dataset(data, train=False, quiet=True)
    if s["test"]:
        test = torch.utils.data.TensorDataset(*(t[:s["test"]] for t in test.tensors))
    return {method: _train(method, rank, world_size, train, test, s) for method in METHODS}


def rows_of(curves):
    rows = []
    for method, curve in curves.items():
        rows += [{"part": "curve", "method": method, **point} for point in curve]
    return rows


def measure(quick=False):
    if (problem := netns.privilege_problem()) is not None:
        raise Skip(problem)
    data = dataset()
    rows = rows_of(nodes.on_nodes(__name__, NODES, quick, rate=RATE, args=(data,)))
    write_csv(NAME, rows, f"{machine_facts()}, {NODES} network-namespace nodes, {RATE}/s links "
                          f"(tbf, {cluster.SCALING_BURST} B bucket), {LABELS[data]}")
    return rows


def report(rows):
    s = netaccuracy_summary(rows)
    sync = s[METHODS[0]]
    print(f"{NODES} nodes, {RATE}/s links, Net, {BATCH} per node; "
          f"to {NETACCURACY_TARGET:.0%} test accuracy:")
    for method, r in s.items():
        reach = (f"{r['seconds']:7.1f} s, {r['bytes'] / 1e6:7.2f} MB per node (step {r['step']})"
                 if r["seconds"] is not None else "not reached")
        print(f"  {method:18s} {reach}; after all {r['total_seconds']:.1f} s: accuracy "
              f"{r['final']:.2%} ({(r['final'] - sync['final']) * 100:+.1f} points vs synchronous)")
    for method, r in s.items():
        if r["seconds"] is not None and sync["seconds"] is not None and method != METHODS[0]:
            print(f"  {method:18s} {sync['seconds'] / r['seconds']:.1f}x faster to the target "
                  f"with {sync['bytes'] / max(r['bytes'], 1):.0f}x fewer bytes than synchronous")


def draw():
    if (measured := measured_as_root(NAME)) is None:
        return []
    rows, facts = measured
    from dist_sgd.bench import plots  # matplotlib: only where we draw

    s = netaccuracy_summary(rows)
    colors = dict(zip(METHODS, ("tab:blue", "tab:purple", "tab:olive", "tab:green", "tab:orange")))
    fig, axes = plots.figure(3, width=5.0, height=4.2)
    for ax, (x, label) in zip(axes[0], (("seconds", "wall time (s), evaluations excluded"),
                                        ("bytes", "MB sent per node"))):
        for method in s:
            curve = [r for r in rows if r["part"] == "curve" and r["method"] == method]
            scale = 1e6 if x == "bytes" else 1
            ax.plot([r[x] / scale for r in curve], [r["accuracy"] for r in curve], "o-", ms=3,
                    color=colors.get(method, "gray"), label=method)
        ax.axhline(NETACCURACY_TARGET, color="gray", ls=":",
                   label=f"target {NETACCURACY_TARGET:.0%}")
        ax.set_xlabel(label)
        ax.set_ylabel("test accuracy")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    axes[0][1].set_xscale("log")
    axes[0][0].set_title("accuracy against wall time", fontsize=10)
    axes[0][1].set_title("accuracy against bytes sent", fontsize=10)
    ax = axes[0][2]
    names = list(s)
    y = range(len(names))
    ax.barh(list(y), [s[n]["seconds"] or 0 for n in names],
            color=[colors.get(n, "gray") for n in names])
    for i, n in enumerate(names):
        r = s[n]
        text = (f"{r['seconds']:.0f} s, {r['bytes'] / 1e6:.1f} MB" if r["seconds"] is not None
                else "not reached")
        ax.text((r["seconds"] or 0), i, " " + text + f"; final {r['final']:.1%}", va="center",
                fontsize=7.5)
    ax.set_yticks(list(y))
    ax.set_yticklabels(names)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.8 * max((s[n]["seconds"] or 0) for n in names) or 1)
    ax.set_xlabel(f"seconds to {NETACCURACY_TARGET:.0%} test accuracy")
    ax.set_title("time to accuracy (bytes per node beside)", fontsize=10)
    data = facts.rsplit(", ", 1)[-1]  # measure() names the dataset last
    title = f"Time to accuracy on {NODES} emulated nodes, {RATE}/s links (Net, {data})"
    return [plots.finish(fig, NAME, title, facts,
                         note=f"global batch {NODES} x {BATCH}, SGD lr {LR} momentum {MOMENTUM}, "
                              f"{EPOCHS} epochs; accuracy on the 10,000 test images every "
                              f"{EVAL_EVERY} steps (clock stopped)")]


if __name__ == "__main__":
    nodes.node_main(_node_work, sys.argv[1:])
