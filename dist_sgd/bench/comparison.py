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
LOCAL = ("single process", "our DataParallel", "nn.DataParallel")


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
    if name == "our DataParallel":
        return DataParallel(model, device_ids=["cpu"] * world_size if device().type == "cpu"
                            else None)
    if name == "nn.DataParallel":
        return torch.nn.DataParallel(model)
    return model


def load(s, dataset_name):
    """(train images, train labels, test set), cut to the sizes of settings `s`."""
    train = get_dataset(dataset_name, quiet=True)
    test = get_dataset(dataset_name, train=False, quiet=True)
    if s["test_items"]:
        test = torch.utils.data.TensorDataset(*(t[:s["test_items"]] for t in test.tensors))
    return (*train.tensors, test)


def run(name, world_size, s, data):
    # world_size: ranks for the distributed strategies, replicas for DataParallel
    """Train one epoch the `name` way (in this process, or this rank); returns the measures."""
    distributed = name in DISTRIBUTED
    rank, ranks = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    images, labels, test = data
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(0))
    order = order[:s["train_items"]] if s["train_items"] else order
    gb = s["global_batch"]
    batches = [order[i:i + gb] for i in range(0, len(order) - gb + 1, gb)]

    def local_batch(idx):  # this process's part of a global batch
        idx = idx.chunk(ranks)[rank]
        return images[idx].to(device()), labels[idx].to(device())

    torch.manual_seed(0)
    model = Net().to(device()).eval()  # eval: dropout off (see the module docstring)
    reference = Net().to(device()).eval()
    reference.load_state_dict(model.state_dict())
    wrapped = _wrap(name, model, world_size)
    opt = SGD(model.parameters(), lr=0.01, momentum=0.5)
    losses, times, compute, dp_times = [], [], [], []
    every = max(1, len(batches) // s["compute_samples"])
    for step, idx in enumerate(batches):
        x, y = local_batch(idx)
        _barrier(distributed)
        start = time.perf_counter()
        opt.zero_grad()
        loss = F.nll_loss(wrapped(x), y)
        loss.backward()
        if name == "average_gradients":
            average_gradients(model)
        if step == 0:  # gradients against one process on the whole global batch
            F.nll_loss(reference(images[idx].to(device())), labels[idx].to(device())).backward()
            grad_diff = max((p.grad - q.grad).abs().max().item()
                            for p, q in zip(model.parameters(), reference.parameters()))
        else:
            times.append(time.perf_counter() - start)  # the first step: warm-up and checking
        opt.step()
        if step + 1 == min(EARLY_STEPS, len(batches)):
            early = _flat(model)
        losses.append(loss.item())
        dp_times.append(sum(getattr(wrapped, "last_times", {}).get(k, 0.0)
                            for k in ("scatter", "replicate", "gather")))
        if distributed and step % every == every - 1:
            compute.append(_compute_only(wrapped, model, x, y))
    accuracy = evaluate(model, test)["accuracy"]  # every rank (or process) takes part
    losses_t = torch.tensor(losses, dtype=torch.float64, device=device())
    times_t = torch.tensor(times, dtype=torch.float64, device=device())
    if distributed:  # the global batch's loss; a step lasts until its slowest rank is done
        dist.all_reduce(losses_t)
        losses_t /= ranks
        dist.all_reduce(times_t, op=dist.ReduceOp.MAX)
    step_s = statistics.median(times_t.tolist())
    if name in ("our DataParallel", "nn.DataParallel"):
        share = statistics.median(dp_times[1:]) / step_s
    else:
        share = max(0.0, 1 - statistics.median(compute) / step_s) if distributed else 0.0
    peak = torch.tensor([_peak_mib()], dtype=torch.float64, device=device())
    if distributed:
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    return {"strategy": name, "processes": ranks, "grad_diff": grad_diff,
            "early": early, "weights": _flat(model),
            "losses": losses_t.tolist(), "accuracy": accuracy, "step_ms": 1e3 * step_s,
            "comm_share": share, "peak_mib": peak.item(), "steps": len(batches)}


def _flat(model):
    return torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()])


def _compute_only(wrapped, model, x, y):
    """Seconds of the same step without gradient synchronization (slowest rank), run between
    real steps so that it sees the same machine load; its gradients are thrown away."""
    _barrier(True)
    start = time.perf_counter()
    model.zero_grad()
    with wrapped.no_sync() if hasattr(wrapped, "no_sync") else _nothing():
        F.nll_loss(wrapped(x), y).backward()
    t = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    model.zero_grad()
    return t.item()


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _barrier(distributed):
    if distributed:
        dist.barrier()


def _peak_mib():
    """Peak memory of this process: GPU allocations on a GPU, else the resident set size."""
    if device().type == "cuda":
        return torch.cuda.max_memory_allocated(device()) / 2 ** 20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _rank(rank, world_size, names, s, dataset_name, replicas):
    data = load(s, dataset_name)
    results = [run(name, replicas, s, data) for name in names]
    return results if rank == 0 else None


def measure(quick=False, world_size=2):
    """Run every strategy, write comparison.csv and comparison_loss.csv; return the table rows
    (None on the ranks of a torchrun job other than 0, which write nothing)."""
    s = settings(quick)
    per_rank_batch(s["global_batch"], world_size)  # a clear error if it does not divide
    dataset_name = get_dataset("auto").name  # says which dataset and why, once
    names = strategies(world_size)
    shared = quick or under_torchrun()
    log(f"comparison: {', '.join(names)}; {world_size} ranks or replicas, global batch "
        f"{s['global_batch']}, {'one group for all' if shared else 'fresh processes each'} ...")
    if shared:
        results = launch(_rank, world_size, names, s, dataset_name, world_size)[0]
    else:
        results = []
        for name in names:
            start = time.perf_counter()
            results += launch(_rank, world_size if name in DISTRIBUTED else 1, [name], s,
                              dataset_name, world_size)[0]
            log(f"  {name}: {results[-1]['steps']} steps in {time.perf_counter() - start:.1f} s")
    if results is None:
        return None
    single, by_name = results[0], {r["strategy"]: r for r in results}
    theirs = by_name.get("torch DDP", single)["weights"]
    rows, curves = [], []
    for r in results:
        rows.append({"strategy": r["strategy"], "processes": r["processes"],
                     "max_grad_diff": r["grad_diff"],
                     "max_weight_diff_early": (r["early"] - single["early"]).abs().max().item(),
                     "max_weight_diff": (r["weights"] - single["weights"]).abs().max().item(),
                     "vs_torch_ddp": (r["weights"] - theirs).abs().max().item(),
                     "final_loss": r["losses"][-1], "accuracy": r["accuracy"],
                     "step_ms": r["step_ms"], "comm_share": r["comm_share"],
                     "peak_mib": r["peak_mib"], "memory": "cumulative" if shared else "own"})
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
                   yscale="log", title="difference from one process (floor 1e-12)")
    for ax in axes[0]:
        ax.legend(fontsize=8)
    paths = [plots.finish(fig, "comparison_loss", "Same data, same seeds: six ways, one curve",
                          facts)]
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
    axes[0][0].legend(fontsize=8)
    paths.append(plots.finish(fig, "comparison_time", "Time per step and memory, per strategy",
                              facts, "memory: ru_maxrss (resident set) of each process; "
                              + ("cumulative over strategies run in one process"
                                 if rows[0]["memory"] == "cumulative" else "fresh processes")))
    return paths
