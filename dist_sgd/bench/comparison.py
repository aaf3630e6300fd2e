"""Lesson 09's comparison: six ways to train the same network on the same batches, side by side.

    single process      one process, the whole global batch
    average_gradients   R ranks, the hand-written sync of lesson 06 after backward
    our DDP             R ranks, dist_sgd.ddp.DistributedDataParallel (buckets, in backward)
    torch DDP           R ranks, torch.nn.parallel.DistributedDataParallel
    our DataParallel    one process, R CPU replicas in threads (dist_sgd.data_parallel)
    nn.DataParallel     only with 2+ GPUs (without, torch's just calls the module: = single)

Same start (seed 0), same global batches of 96 items (divisible by 1, 2, 3 and 4) in the same
order (a fixed permutation of the training set; rank r takes the r-th slice of each global
batch), our SGD with the same settings. The network is the lessons' Net with dropout off (eval
mode): with dropout on, each strategy would draw different masks and we would be comparing
random numbers, not the arithmetic.

Measured per strategy: the largest gradient difference at the first step, and weight difference
after 10 steps and at the end, against the single process (and the weights against torch DDP's);
the loss of every global batch; test accuracy after the epoch; time per step (median, slowest
rank); the share of a step spent communicating (1 - the same step without gradient sync, timed
between real steps, / the step; for DataParallel: its scatter, replicate and gather / the
step); and peak resident memory per process (ru_maxrss: each strategy in fresh processes, except
with --quick or under torchrun, where the runs share processes and the peak is cumulative).
"""
import resource
from contextlib import nullcontext
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from dist_sgd.bench import common, plots
from dist_sgd.data import get_dataset
from dist_sgd.data_parallel import DataParallel
from dist_sgd.ddp import DistributedDataParallel
from dist_sgd.launch import device, launch, log, under_torchrun
from dist_sgd.models import Net
from dist_sgd.optim import SGD
from dist_sgd.sync import average_gradients
from dist_sgd.train import evaluate, per_rank_batch

DISTRIBUTED = ("average_gradients", "our DDP", "torch DDP")
EARLY_STEPS = 10  # weights compared after this many steps (rounding only) and at the end
MEMORY_STEPS = 20  # steps of the short fresh-process runs that measure peak memory


def settings(quick):
    if quick:
        return {"train_items": 960, "test_items": 500, "global_batch": 96, "compute_samples": 3}
    return {"train_items": None, "test_items": None, "global_batch": 96, "compute_samples": 50}


def strategies(world_size):
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    names = ["single process", "average_gradients", "our DDP", "torch DDP", "our DataParallel"]
    return names + (["nn.DataParallel"] if gpus >= 2 else [])


def _wrap(name, model, world_size):
    if name == "our DDP":
        return DistributedDataParallel(model)
    if name == "torch DDP":
        ids = [device().index] if device().type == "cuda" else None
        return TorchDDP(model, device_ids=ids)
    if name in ("our DataParallel", "nn.DataParallel"):
        if device().type == "cpu":
            ids = ["cpu"] * world_size
        else:  # the model sits on this rank's GPU: DataParallel's first device must be it
            gpus = torch.cuda.device_count()
            ids = [(device().index + i) % gpus for i in range(min(world_size, gpus))]
        if name == "our DataParallel":
            return DataParallel(model, device_ids=ids)
        return torch.nn.DataParallel(model, device_ids=ids)
    return model


def load(s, dataset_name):
    """(train images, train labels, test set), cut to the sizes of settings `s`."""
    train = get_dataset(dataset_name, quiet=True)
    test = get_dataset(dataset_name, train=False, quiet=True)
    if s["test_items"]:
        test = torch.utils.data.TensorDataset(*(t[:s["test_items"]] for t in test.tensors))
    return (*train.tensors, test)


class Trainer:
    """One strategy's model, optimizer and measurements; step() trains on one global batch."""

    def __init__(self, name, replicas, s, data):
        self.name, self.s, self.tensors = name, s, data
        self.distributed = name in DISTRIBUTED
        self.rank, self.ranks = ((dist.get_rank(), dist.get_world_size()) if self.distributed
                                 else (0, 1))
        torch.manual_seed(0)
        self.model = Net().to(device()).eval()  # eval: dropout off (see the module docstring)
        self.reference = Net().to(device()).eval()
        self.reference.load_state_dict(self.model.state_dict())
        self.wrapped = _wrap(name, self.model, replicas)
        self.opt = SGD(self.model.parameters(), lr=0.01, momentum=0.5)
        self.losses, self.times, self.compute, self.dp_times = [], [], [], []

    def step(self, step, idx, every, last):
        images, labels, _ = self.tensors
        part = idx.chunk(self.ranks)[self.rank]  # this process's slice of the global batch
        x, y = images[part].to(device()), labels[part].to(device())
        _barrier(self.distributed)
        start = time.perf_counter()
        self.opt.zero_grad()
        loss = F.nll_loss(self.wrapped(x), y)
        loss.backward()
        if self.name == "average_gradients":
            average_gradients(self.model)
        if step == 0:  # gradients against one process on the whole global batch
            F.nll_loss(self.reference(images[idx].to(device())),
                       labels[idx].to(device())).backward()
            self.grad_diff = max((p.grad - q.grad).abs().max().item() for p, q in
                                 zip(self.model.parameters(), self.reference.parameters()))
        else:
            self.times.append(time.perf_counter() - start)  # step 0: warm-up and checking
        self.opt.step()
        if step + 1 == min(EARLY_STEPS, last + 1):
            self.early = _flat(self.model)
        self.losses.append(loss.item())
        self.dp_times.append(sum(getattr(self.wrapped, "last_times", {}).get(k, 0.0)
                                 for k in ("scatter", "replicate", "gather")))
        if self.distributed and step % every == every - 1:
            self.compute.append(_compute_only(self.wrapped, self.model, x, y))

    def result(self):
        accuracy = evaluate(self.model, self.tensors[2])["accuracy"]  # every rank takes part
        losses = torch.tensor(self.losses, dtype=torch.float64, device=device())
        times = torch.tensor(self.times, dtype=torch.float64, device=device())
        if self.distributed:  # the global batch's loss; a step lasts until its slowest rank
            dist.all_reduce(losses)
            losses /= self.ranks
            dist.all_reduce(times, op=dist.ReduceOp.MAX)
        step_s = statistics.median(times.tolist())
        if self.name in ("our DataParallel", "nn.DataParallel"):
            share = statistics.median(self.dp_times[1:]) / step_s
        elif self.distributed:
            share = max(0.0, 1 - statistics.median(self.compute) / step_s)
        else:
            share = 0.0
        return {"strategy": self.name, "processes": self.ranks, "grad_diff": self.grad_diff,
                "early": self.early, "weights": _flat(self.model), "losses": losses.tolist(),
                "accuracy": accuracy, "step_ms": 1e3 * step_s, "comm_share": share,
                "steps": len(self.losses)}


def run(names, replicas, s, data, max_steps=None):
    """Train the strategies `names` side by side, one global batch at a time, taking turns
    (the order rotates every step, as time_alternating does), so that a burst of load on a
    shared machine hits them all alike. replicas: the number of DataParallel replicas."""
    images = data[0]
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(0))
    order = order[:s["train_items"]] if s["train_items"] else order
    gb = s["global_batch"]
    batches = [order[i:i + gb] for i in range(0, len(order) - gb + 1, gb)][:max_steps]
    every = max(1, len(batches) // s["compute_samples"])
    trainers = [Trainer(name, replicas, s, data) for name in names]
    for step, idx in enumerate(batches):
        k = step % len(trainers)
        for t in trainers[k:] + trainers[:k]:
            t.step(step, idx, every, len(batches) - 1)
    return [t.result() for t in trainers]


def _flat(model):
    return torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()])


def _compute_only(wrapped, model, x, y):
    """Seconds of the same step without gradient synchronization (slowest rank), run between
    real steps so that it sees the same machine load; its gradients are thrown away."""
    _barrier(True)
    start = time.perf_counter()
    model.zero_grad()
    with wrapped.no_sync() if hasattr(wrapped, "no_sync") else nullcontext():
        F.nll_loss(wrapped(x), y).backward()
    t = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    model.zero_grad()
    return t.item()


def _barrier(distributed):
    if distributed:
        dist.barrier()


def _peak_mib():
    """Peak memory of this process: GPU allocations on a GPU, else the resident set size."""
    if device().type == "cuda":
        return torch.cuda.max_memory_allocated(device()) / 2 ** 20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _rank(rank, world_size, groups, s, dataset_name, replicas, max_steps=None):
    """Each group of strategies trains side by side; then this process's peak memory."""
    data = load(s, dataset_name)
    results = [r for names in groups for r in run(names, replicas, s, data, max_steps)]
    peak = torch.tensor([_peak_mib()], dtype=torch.float64, device=device())
    if dist.is_initialized():
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    return (results, peak.item()) if rank == 0 else None


def measure(quick=False, world_size=2):
    """Run every strategy, write comparison.csv and comparison_loss.csv; return the table rows
    (None on the ranks of a torchrun job other than 0, which write nothing).

    The distributed strategies train side by side in one group, the single-process ones side
    by side in one process. Peak memory needs a fresh process per strategy: a short run of
    MEMORY_STEPS steps each (--quick and torchrun: one group for everything, peak cumulative).
    """
    s = settings(quick)
    per_rank_batch(s["global_batch"], world_size)  # a clear error if it does not divide
    dataset_name = get_dataset("auto").name  # says which dataset and why, once
    names = strategies(world_size)
    groups = [[n for n in names if n in DISTRIBUTED], [n for n in names if n not in DISTRIBUTED]]
    shared = quick or under_torchrun()
    log(f"comparison: {', '.join(names)}; {world_size} ranks or replicas, global batch "
        f"{s['global_batch']}, taking turns step by step ...")
    start = time.perf_counter()
    if shared:
        out = launch(_rank, world_size, groups, s, dataset_name, world_size)[0]
        results, peaks = (None, None) if out is None else (out[0], {n: out[1] for n in names})
    else:
        results, peaks = [], {}
        for group in groups:
            results += launch(_rank, world_size if group[0] in DISTRIBUTED else 1, [group], s,
                              dataset_name, world_size)[0][0]
        log(f"  trained in {time.perf_counter() - start:.1f} s; peak memory, "
            f"{MEMORY_STEPS} steps in fresh processes per strategy ...")
        for name in names:
            peaks[name] = launch(_rank, world_size if name in DISTRIBUTED else 1, [[name]], s,
                                 dataset_name, world_size, MEMORY_STEPS)[0][1]
    if results is None:
        return None
    results.sort(key=lambda r: names.index(r["strategy"]))
    single, by_name = results[0], {r["strategy"]: r for r in results}
    theirs = by_name.get("torch DDP", single)["weights"]
    rows, curves = [], []
    for r in results:
        rows.append({"strategy": r["strategy"], "processes": r["processes"],
                     "max_grad_diff": r["grad_diff"],
                     "max_weight_diff_early": (r["early"] - single["early"]).abs().max().item(),
                     "max_weight_diff": (r["weights"] - single["weights"]).abs().max().item(),
                     "vs_torch_ddp": (r["weights"] - theirs).abs().max().item(),
                     "steps": r["steps"], "final_loss": r["losses"][-1],
                     "accuracy": r["accuracy"],
                     "step_ms": r["step_ms"], "comm_share": r["comm_share"],
                     "peak_mib": peaks[r["strategy"]],
                     "memory": "cumulative" if shared else "own"})
        curves += [{"strategy": r["strategy"], "step": i, "loss": v}
                   for i, v in enumerate(r["losses"])]
    common.write_csv("comparison", rows)
    common.write_csv("comparison_loss", curves)
    return rows


def table(rows):
    """The comparison as a markdown table (the lesson prints it, the README shows it)."""
    lines = [f"| strategy | processes | max grad diff, step 1 | max weight diff, step "
             f"{EARLY_STEPS} | max weight diff, end | vs torch DDP, end | test accuracy | "
             "ms / step | communicating | peak MiB / process |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        mem = f"{r['peak_mib']:.0f}" + (" (cumulative)" if r["memory"] == "cumulative" else "")
        lines.append(f"| {r['strategy']} | {r['processes']} | {r['max_grad_diff']:.1e} | "
                     f"{r['max_weight_diff_early']:.1e} | {r['max_weight_diff']:.1e} | "
                     f"{r['vs_torch_ddp']:.1e} | {100 * r['accuracy']:.2f}% | "
                     f"{r['step_ms']:.2f} | {100 * r['comm_share']:.0f}% | {mem} |")
    return "\n".join(lines)


def draw():
    rows, facts = common.read_csv("comparison")
    curves, _ = common.read_csv("comparison_loss")
    names = [r["strategy"] for r in rows]
    fig, axes = plots.figure(2, width=6)
    single = [c["loss"] for c in curves if c["strategy"] == names[0]]
    for i, name in enumerate(names):
        loss = [c["loss"] for c in curves if c["strategy"] == name]
        axes[0][0].plot(loss, label=name, lw=1.2, ls=("-", "--", ":", "-.")[i % 4])
        if i:
            axes[0][1].plot([abs(a - b) + 1e-12 for a, b in zip(loss, single)], label=name, lw=1)
    axes[0][0].set(xlabel="step (global batch)", ylabel="training loss (nll)",
                   title="loss of every global batch")
    axes[0][1].set(xlabel="step (global batch)", ylabel="|loss - single process's loss|",
                   yscale="log", title="difference from one process")
    for ax in axes[0]:
        ax.legend(fontsize=8)
    paths = [plots.finish(fig, "comparison_loss",
                          f"Same data, same seeds: {len(names)} ways to train, one curve", facts,
                          "right: curves that coincide hide each other; 1e-12 stands for 0")]
    fig, axes = plots.figure(2, width=6)
    y = range(len(rows))
    comm = [r["step_ms"] * r["comm_share"] for r in rows]
    axes[0][0].barh(y, [r["step_ms"] - c for r, c in zip(rows, comm)], color="tab:green",
                    label="computing (and the rest)")
    axes[0][0].barh(y, comm, left=[r["step_ms"] - c for r, c in zip(rows, comm)],
                    color="tab:red", label="communicating (not hidden)")
    axes[0][0].set(xlabel="ms per step (median)", title="time per step")
    axes[0][1].barh(y, [r["peak_mib"] for r in rows], color="tab:gray")
    axes[0][1].set(xlabel="MiB (peak per process)", title="peak memory")
    for ax in axes[0]:
        ax.set_yticks(list(y), names)
        ax.invert_yaxis()
    axes[0][0].set_xlim(0, 1.6 * max(r["step_ms"] for r in rows))  # room for the legend
    axes[0][0].legend(fontsize=8, loc="upper right")
    paths.append(plots.finish(fig, "comparison_time", "Time per step and memory, per strategy",
                              facts, "memory: ru_maxrss (resident set) of each process; "
                              + ("cumulative over strategies run in one process"
                                 if rows[0]["memory"] == "cumulative" else "fresh processes")))
    return paths
