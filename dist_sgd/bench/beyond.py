"""Lesson 15's figures: beyond synchronous all-reduce, measured on one machine.

Three measurements, each in one group of processes (rank 0 the parameter server; it sits out
the all-reduce methods):
  target     all-reduce SGD and local SGD H=8 for 2 epochs: accuracy, bytes per step.
                                                    -> beyond_target.csv
  training   Net on the same data, global batch, lr per item and momentum: all-reduce SGD, sync PS,
             sync PS and async PS with one worker slowed 3x, local SGD H = 1, 4, 8, 16, and
             Hogwild: loss against steps and wall time, test accuracy, bytes per step,
             async staleness.                       -> beyond.csv, beyond_summary.csv, beyond.png
  straggler  sync PS vs async PS, one worker 3x slower, alternated short runs, median
             throughput (items/s).                  -> beyond_straggler.csv
  ps cost    one sync PS round (pull + push, no compute) for 1..3 workers and two sizes
             against the cost model's parameter_server line (alpha, beta from figure 2's
             p2p.csv).                                -> beyond_ps_cost.csv, beyond_ps_cost.png
"""
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from dist_sgd.beyond import ps
from dist_sgd.beyond.hogwild import hogwild
from dist_sgd.beyond.local_sgd import LocalSGD
from dist_sgd.plumbing.figures import read_csv, write_csv
from dist_sgd.plumbing.launch import launch
from dist_sgd.scale.costmodel import human_bytes, predict_all_reduce
from dist_sgd.sgd.data import get_dataset
from dist_sgd.sgd.models import BigNet, Net, count_parameters, init_weights
from dist_sgd.sgd.train import evaluate, per_rank_batch

NAME = "beyond"
GLOBAL_BATCH, LR, MOMENTUM, SLOW, WORKERS = 60, 0.05, 0.9, 3, 2
PERIODS = (1, 4, 8, 16)


def settings(quick):
    # Fashion-MNIST: 60,000 images / 60 = 1,000 steps per epoch. The comparison of every
    # method runs 400 steps (a loaded 2-core machine); the target pair, all-reduce SGD and
    # local SGD H=8, runs 2 epochs.
    return {"steps": 30 if quick else 400, "target_steps": 40 if quick else 2000,
            "test_items": 1000 if quick else None,
            "straggler_updates": 20 if quick else 60, "straggler_repeats": 2 if quick else 5,
            "cost_rounds": 5 if quick else 30}


def _fresh(dropout_seed):
    torch.manual_seed(0)
    model = Net()
    model.apply(init_weights)
    torch.manual_seed(dropout_seed)
    return model


class _Batches:
    """Worker `me`'s slice of global batch k (a fixed permutation; wraps around)."""

    def __init__(self, data, me, n_workers):
        self.data, self.me, self.b = data, me, per_rank_batch(GLOBAL_BATCH, n_workers)
        self.order = torch.randperm(len(data), generator=torch.Generator().manual_seed(0))

    def gradient(self, model, k, slow=False):
        start = time.perf_counter()
        first = (k * GLOBAL_BATCH) % (len(self.order) - GLOBAL_BATCH + 1)
        x, y = self.data[self.order[first + self.me * self.b:first + (self.me + 1) * self.b]]
        model.zero_grad()
        loss = F.nll_loss(model(x), y)
        loss.backward()
        if slow:
            time.sleep((SLOW - 1) * (time.perf_counter() - start))
        return loss.item()


def _synchronous(rank, workers, group, batches, steps, period):
    model = _fresh(rank)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    local = LocalSGD(model.parameters(), period=period, group=group) if period else None
    rec, start = [], time.perf_counter()
    for k in range(steps):
        loss = batches.gradient(model, k)
        if local is None:
            for p in model.parameters():
                dist.all_reduce(p.grad, group=group)
                p.grad /= len(workers)
        opt.step()
        if local is not None:
            local.step()
        rec.append((time.perf_counter() - start, loss))
    n = sum(p.numel() * p.element_size() for p in model.parameters())
    W = len(workers)
    sent = local.bytes_per_sync * local.syncs if local else 2 * (W - 1) / W * n * steps
    return {"rec": rec, "bytes": sent, "weights": ps.flat_weights(model)}


def _ps(rank, servers, workers, batches, mode, updates, slow):
    model = _fresh(rank)
    if rank in servers:
        lr = LR if mode == "sync" else LR / len(workers)  # the same lr per item (linear rule)
        stats = ps.ParameterServer(model, servers, workers, lr, MOMENTUM, mode=mode,
                                   max_updates=updates).serve()
        stats.pop("weights")
        return stats
    worker, rec, start, k = ps.Worker(model, servers), [], time.perf_counter(), 0
    while worker.pull():
        loss = batches.gradient(model, k, slow and rank == workers[-1])
        worker.push()
        rec.append((time.perf_counter() - start, loss, worker.version))
        k += 1
    stats = worker.finish()
    return {"rec": rec, "bytes": stats["bytes_sent"], "weights": ps.flat_weights(model)}


def _training(rank, world_size, steps, only=None):
    servers, workers = ps.roles(world_size)
    group = dist.new_group(workers)
    data = get_dataset("auto", quiet=True)
    me = workers.index(rank) if rank in workers else 0
    batches, W = _Batches(data, me, len(workers)), len(workers)
    runs = {"all-reduce SGD": lambda: _synchronous(rank, workers, group, batches, steps, None),
            "sync PS": lambda: _ps(rank, servers, workers, batches, "sync", steps, False),
            "sync PS, 1 slow worker": lambda: _ps(rank, servers, workers, batches, "sync", steps,
                                                  True),
            "async PS, 1 slow worker": lambda: _ps(rank, servers, workers, batches, "async",
                                                   steps * W, True)}
    for h in PERIODS:
        runs[f"local SGD H={h}"] = lambda h=h: _synchronous(rank, workers, group, batches, steps, h)
    out = {}
    for name, run in runs.items():
        if only and name not in only:
            continue
        if rank in workers or "PS" in name:
            out[name] = run()
        dist.barrier()
    return out


def _straggler(rank, world_size, updates, repeats):
    """Alternate sync and async PS runs with a 3x slower worker; items/s of each run."""
    servers, workers = ps.roles(world_size)
    data = get_dataset("auto", quiet=True)
    batches = _Batches(data, workers.index(rank) if rank in workers else 0, len(workers))
    samples = {"sync": [], "async": []}
    for i in range(repeats):
        for mode in (("sync", "async") if i % 2 == 0 else ("async", "sync")):
            dist.barrier()
            start = time.perf_counter()
            n = updates if mode == "sync" else updates * len(workers)
            _ps(rank, servers, workers, batches, mode, n, slow=True)
            seconds = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
            dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
            samples[mode].append(updates * GLOBAL_BATCH / seconds.item())
    return samples


def _ps_cost(rank, world_size, sizes, rounds):
    """Median seconds of one sync PS round (pull + push, no compute) for 1..world_size-1 workers."""
    rows = []
    for numel in sizes:
        for p in range(1, world_size):
            model = nn.Linear(numel, 1, bias=False)  # numel parameters: only their size matters
            servers, workers = [0], list(range(1, p + 1))
            if rank == 0:
                ps.ParameterServer(model, servers, workers, lr=0.0, mode="sync").serve()
            elif rank in workers:
                worker = ps.Worker(model, servers)
                model.weight.grad = torch.zeros_like(model.weight)
                worker.pull()
                times = []
                for _ in range(rounds):
                    start = time.perf_counter()
                    worker.push()
                    worker.pull()
                    times.append(time.perf_counter() - start)
                worker.finish()
                if rank == 1:
                    rows.append({"workers": p, "bytes": numel * 4,
                                 "seconds": statistics.median(times), "rounds": rounds})
            dist.barrier()
    return rows


def measure(quick=False):
    s = settings(quick)
    measure_training(s)
    measure_straggler_and_cost(s)
    measure_target(s)
    return load()


def load():
    """The rows report() starts from (the harness's --redraw calls this too)."""
    return read_csv(NAME + "_summary")[0]


def _setup(s):
    """The world (a server and the workers), the test set, and who is who."""
    world = WORKERS + 1
    test = get_dataset("auto", train=False, quiet=True)
    if s["test_items"]:
        test = TensorDataset(*(t[:s["test_items"]] for t in test.tensors))
    return (world, test, *ps.roles(world))


def measure_training(s):
    world, test, servers, workers = _setup(s)
    results = launch(_training, world, s["steps"], backend="gloo", timeout=7200)
    methods = {name: [results[w][name] for w in workers] for name in results[workers[0]]}
    for name in methods:
        methods[name][0]["bytes"] += results[0].get(name, {}).get("bytes_sent", 0)
    model = _fresh(0)
    hog = hogwild(model, get_dataset("auto", quiet=True), processes=WORKERS, steps=s["steps"],
                  batch_size=GLOBAL_BATCH // WORKERS, lr=LR / WORKERS, momentum=MOMENTUM)
    methods["Hogwild"] = [{"rec": list(zip(t, l)), "bytes": 0, "weights": ps.flat_weights(model)}
                          for t, l in zip(hog["times"], hog["losses"])]

    curve, summary = [], []
    for name, runs in methods.items():
        # One point per global batch's worth of items: the workers' records merged in time.
        merged = sorted((r[0], r[1]) for run in runs for r in run["rec"])
        for i in range(0, len(merged) - len(runs) + 1, len(runs)):
            chunk = merged[i:i + len(runs)]
            curve.append({"method": name, "step": i // len(runs) + 1, "seconds": chunk[-1][0],
                          "loss": sum(c[1] for c in chunk) / len(chunk)})
        net = Net()
        torch.nn.utils.vector_to_parameters(runs[0]["weights"], net.parameters())
        wall = max(run["rec"][-1][0] for run in runs)
        summary.append({"method": name, "steps": s["steps"], "seconds": wall,
                        "items_per_s": s["steps"] * GLOBAL_BATCH / wall,
                        "accuracy": evaluate(net, test)["accuracy"],
                        "bytes_per_step": sum(run["bytes"] for run in runs) / s["steps"]})
    write_csv(NAME, curve)
    write_csv(NAME + "_summary", summary)
    stale = results[0]["async PS, 1 slow worker"]["staleness"]
    write_csv(NAME + "_staleness", [{"staleness": k, "updates": stale.count(k)}
                                           for k in range(max(stale) + 1)])



def measure_straggler_and_cost(s):
    world = WORKERS + 1
    samples = launch(_straggler, world, s["straggler_updates"], s["straggler_repeats"],
                     backend="gloo", timeout=7200)[0]
    write_csv(NAME + "_straggler", [{"mode": m, "run": i, "items_per_s": v}
                                           for m, vs in samples.items() for i, v in enumerate(vs)])
    sizes = [count_parameters(Net()), count_parameters(BigNet())]
    cost = launch(_ps_cost, 4, sizes, s["cost_rounds"], backend="gloo", timeout=7200)[1]
    write_csv(NAME + "_ps_cost", cost)



def measure_target(s):
    """Last, and longest: local SGD H=8 against all-reduce SGD over 2 epochs."""
    world, test, servers, workers = _setup(s)
    pair = ["all-reduce SGD", "local SGD H=8"]
    target = launch(_training, world, s["target_steps"], pair, backend="gloo", timeout=7200)
    rows = []
    for name in pair:
        run = target[workers[0]][name]
        net = Net()
        torch.nn.utils.vector_to_parameters(run["weights"], net.parameters())
        sent = sum(target[w][name]["bytes"] for w in workers)
        rows.append({"method": name, "steps": s["target_steps"],
                     "epochs": s["target_steps"] * GLOBAL_BATCH / len(get_dataset("auto",
                                                                                 quiet=True)),
                     "accuracy": evaluate(net, test)["accuracy"],
                     "bytes_per_step": sent / s["target_steps"],
                     "seconds": max(target[w][name]["rec"][-1][0] for w in workers)})
    write_csv(NAME + "_target", rows)


def report(summary):
    facts = read_csv(NAME + "_summary")[1]
    print(f"measured on: {facts} (times on a loaded, shared machine: compare rows, not absolutes)")
    print(f"{'method':26s} {'steps':>6s} {'seconds':>8s} {'items/s':>8s} {'accuracy':>9s} "
          f"{'KiB sent/step':>14s}")
    for r in summary:
        print(f"{r['method']:26s} {r['steps']:6d} {r['seconds']:8.1f} {r['items_per_s']:8.0f} "
              f"{100 * r['accuracy']:8.2f}% {r['bytes_per_step'] / 1024:14.1f}")
    print("\nlocal SGD and the asynchronous server, measured:")
    try:
        (sync, h8), _ = read_csv(NAME + "_target")
    except FileNotFoundError:
        sync = h8 = None
        print("  local SGD H=8 vs all-reduce SGD for 2 epochs: not measured (no beyond_target.csv)")
    if h8:
        epochs = sync["epochs"]
        fewer = sync["bytes_per_step"] / h8["bytes_per_step"]
        print(f"  local SGD H=8: bytes per step {fewer:.2f}x fewer than all-reduce SGD")
        print(f"  local SGD H=8 accuracy after {epochs:.2f} epochs: {100 * h8['accuracy']:.2f}% vs "
              f"all-reduce SGD {100 * sync['accuracy']:.2f}%: "
              f"{100 * (h8['accuracy'] - sync['accuracy']):+.2f} points")
    rows, _ = read_csv(NAME + "_straggler")
    med = {m: statistics.median(r["items_per_s"] for r in rows if r["mode"] == m)
           for m in ("sync", "async")}
    pairs = [a["items_per_s"] / s["items_per_s"] for a in rows for s in rows
             if a["mode"] == "async" and s["mode"] == "sync" and a["run"] == s["run"]]
    print(f"  one worker {SLOW}x slower: async PS {med['async']:.0f} items/s vs sync PS "
          f"{med['sync']:.0f} items/s (medians of {len(rows) // 2} alternated runs each): "
          f"{med['async'] / med['sync']:.2f}x; run by run "
          + ", ".join(f"{x:.2f}x" for x in pairs))
    return summary


def _ps_model(nbytes, workers, fit):
    """costmodel's parameter_server cost, 2p (alpha + n beta). Written out: its
    predict_all_reduce returns 0 for p = 1, but with one worker there is still a server."""
    if workers >= 2:
        return predict_all_reduce("parameter_server", nbytes, workers, fit[0], fit[1])
    return 2 * (fit[0] + nbytes * fit[1])


def _cost_model():
    from dist_sgd.bench import p2p

    fit = p2p.load_fit()
    return (fit[0], fit[1], fit[2]) if fit else None


def draw():
    from dist_sgd.bench import plots

    curve, facts = read_csv(NAME)
    summary, _ = read_csv(NAME + "_summary")
    stale, _ = read_csv(NAME + "_staleness")
    fig, axes = plots.figure(2, 2, width=6.2, height=4.4)
    (ax_step, ax_time), (ax_bytes, ax_stale) = axes
    for name in [r["method"] for r in summary]:
        pts = [r for r in curve if r["method"] == name]
        k = max(1, len(pts) // 100)  # a running mean over ~1% of the run: readable curves
        loss = [sum(p["loss"] for p in pts[max(0, i - k):i + 1]) / len(pts[max(0, i - k):i + 1])
                for i in range(len(pts))]
        style = "--" if "PS" in name else (":" if "Hog" in name else "-")
        ax_step.plot([p["step"] for p in pts], loss, style, label=name, lw=1.2)
        ax_time.plot([p["seconds"] for p in pts], loss, style, label=name, lw=1.2)
    for ax, x in ((ax_step, "global batches of data (steps)"), (ax_time, "wall time (s)")):
        ax.set_xlabel(x)
        ax.set_ylabel("training loss (running mean)")
        ax.legend(fontsize=7)
    ax_step.set_title("loss against steps (the same data)")
    ax_time.set_title("loss against wall time")
    names = [r["method"] for r in summary]
    ax_bytes.barh(names, [r["bytes_per_step"] / 1024 for r in summary], color="tab:blue")
    for i, r in enumerate(summary):
        ax_bytes.text(r["bytes_per_step"] / 1024, i, f" {100 * r['accuracy']:.1f}% acc",
                      va="center", fontsize=7)
    ax_bytes.set_xlabel("KiB sent per global batch, all ranks together")
    ax_bytes.set_title("bytes per step (and test accuracy)")
    ax_bytes.invert_yaxis()
    ax_stale.bar([r["staleness"] for r in stale], [r["updates"] for r in stale], color="tab:brown")
    ax_stale.set_xlabel("staleness (updates the gradient missed)")
    ax_stale.set_ylabel("updates")
    ax_stale.set_title("async PS with one 3x-slow worker: staleness")
    paths = [plots.finish(fig, NAME, f"Beyond synchronous all-reduce: {WORKERS} workers, Net, "
                          f"global batch {GLOBAL_BATCH}", facts,
                          note="PS methods: rank 0 is the server; all-reduce bytes: ring model "
                               "2(p-1)/p n per rank; PS bytes: counted")]

    cost, facts = read_csv(NAME + "_ps_cost")
    fig, axes = plots.figure(1)
    ax = axes[0][0]
    fit = _cost_model()
    for nbytes, color in zip(sorted({r["bytes"] for r in cost}), ("tab:blue", "tab:red")):
        rows = [r for r in cost if r["bytes"] == nbytes]
        p = [r["workers"] for r in rows]
        ax.plot(p, [r["seconds"] * 1e3 for r in rows], "o-", color=color,
                label=f"measured, {human_bytes(nbytes)}")
        if fit:
            ax.plot(p, [_ps_model(nbytes, q, fit) * 1e3 for q in p], "--", color=color,
                    label=f"cost model 2p(alpha + n beta), {human_bytes(nbytes)}")
    ax.set_xlabel("workers p (one server)")
    ax.set_ylabel("one sync round: pull + push (ms)")
    ax.set_yscale("log")
    ax.set_xticks(sorted({r["workers"] for r in cost}))
    ax.legend(fontsize=8)
    ax.set_title("parameter server: the server's link carries 2pn bytes")
    note = ("model: alpha, beta fitted to figure 2's ping-pong (p2p.csv)" if fit
            else "no p2p.csv: model line not drawn")
    paths.append(plots.finish(fig, NAME + "_ps_cost", "Parameter server round time vs workers",
                              facts, note=note))
    if fit:
        print("\nparameter server, one sync round (pull + push), measured vs cost model:")
        for r in cost:
            model = _ps_model(r["bytes"], r["workers"], fit)
            print(f"  {human_bytes(r['bytes']):>9s}, {r['workers']} worker(s): "
                  f"{r['seconds'] * 1e3:8.2f} ms measured, {model * 1e3:7.2f} ms model "
                  f"({r['seconds'] / model:.1f}x)")
    return paths
