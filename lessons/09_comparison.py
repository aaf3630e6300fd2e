"""Lesson 09: the comparison - one network, one epoch, every way to train it, side by side.

Everything built so far, on the same data, seeds and global batch (96 items):
  single process       the baseline every other way must reproduce
  average_gradients    lesson 06: all-reduce every gradient after backward
  our DDP              lesson 07: buckets, all-reduced during backward
  torch DDP            torch.nn.parallel.DistributedDataParallel
  our DataParallel     lesson 08: one process, replicas in threads
  torch DataParallel   torch.nn.DataParallel, only with 2+ GPUs (with none it just calls the module)

The comparison loop is below: the three distributed ways train in one process group, taking
turns step by step (the order rotates, so a burst of load on a shared machine hits them all
alike); rank r takes the r-th slice of each global batch. Then the launching process (rank 0
under torchrun) trains the one-process ways the same way, on one thread. The network is Net
with dropout off (eval mode): with dropout on, every way would draw different masks and we
would compare random numbers, not arithmetic.

For each way: the largest gradient difference at the first step and weight difference after
10 steps (checked: float32 rounding only), and at the end of the epoch, against the single
process and against torch DDP; test accuracy; time per step (median, slowest rank); the loss
of every global batch; and peak memory per process (over all the ways that process trained).
Where a step's time goes (computing, communicating, waiting) is the benchmark's breakdown
figure (`python -m dist_sgd.bench breakdown`).

What to expect: the differences start as float32 rounding (about 1e-8: the same numbers added
in another order). Over an epoch they grow, because a tiny difference can tip a ReLU or a
max-pool the other way and SGD carries it on; compare the test accuracies, which agree. On a
2-core laptop two ranks split each batch but share the two cores with the communication
(copying through the loopback network): with this small model both DDPs can still beat one
process (they hide part of the communication behind backward), average_gradients does not,
and 4 ranks on 2 cores would not. Peak memory per process is mostly torch itself and the
dataset (each process loads its own copy: DDP's real memory cost on one machine); Net's
weights and gradients are 0.2 MB.

On a GPU, one more difference, far bigger than rounding: TF32. On Ampere and later NVIDIA GPUs
cuDNN's convolutions round float32 inputs to TF32 by default (a 10-bit mantissa, about 3
decimal digits; the sums stay float32): faster, and coarse. Run on one H200 (torch 2.11) with
TF32 on, this lesson's average_gradients differed from the single process by 2.44e-04 at step
1, over the tolerance of 1e-05; with TF32 off (NVIDIA_TF32_OVERRIDE=0) the check passed.
Training does not mind; a comparison does. So run() turns it off, and so does every lesson
that compares float32 results (dist_sgd.plumbing.check.exact_float32):
    torch.backends.cudnn.allow_tf32 = False          # convolutions (on by default)
    torch.backends.cuda.matmul.allow_tf32 = False    # matmuls (off by default since torch 1.12)
A GPU can also differ from itself: some kernels add with atomics, in whatever order threads
finish. torch.use_deterministic_algorithms(True) picks deterministic ones; a "bit for bit"
claim on a GPU holds only with it.

Run:
    python lessons/09_comparison.py --world-size 2      # a full epoch: about a minute
    python lessons/09_comparison.py --quick             # 10 steps on a small slice
    python lessons/09_comparison.py --save-figures      # also write figures/comparison*.csv
    torchrun --standalone --nproc-per-node 2 lessons/09_comparison.py --quick
The benchmark draws figures/comparison_loss.png and comparison_time.png from those CSVs
(README, "Figures": its --redraw comparison).

Exercises:
  1. Turn dropout back on (Net().train() in Way.__init__): which columns change, and why do
     the ways no longer agree with each other?
  2. Run with --world-size 4 (oversubscribed on 2 cores): what happens to time per step?
     Predict it first with the cost model of lesson 10.
  3. Replace Net by BigNet (1.2 M parameters): which way wins now?
  4. Why does DataParallel's peak memory grow with the number of replicas on a GPU, but barely
     on the CPU (hint: what does replicate() copy on the CPU)?
"""
import resource
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as TorchDDP
from torch.utils.data import TensorDataset

from dist_sgd.ddp.data_parallel import DataParallel
from dist_sgd.ddp.ddp import DistributedDataParallel
from dist_sgd.plumbing.check import check, max_diff
from dist_sgd.plumbing.figures import write_csv
from dist_sgd.plumbing.launch import launch, lesson_parser
from dist_sgd.plumbing.rank import device, log, world
from dist_sgd.sgd.data import get_dataset
from dist_sgd.sgd.models import Net
from dist_sgd.sgd.optim import SGD
from dist_sgd.sgd.sync import average_gradients
from dist_sgd.sgd.train import evaluate, per_rank_batch

DISTRIBUTED = ("average_gradients", "our DDP", "torch DDP")
GLOBAL_BATCH, EARLY = 96, 10  # 96 divides over 1, 2, 3 and 4 ranks; weights checked at step 10


def wrap(name, model, replicas):
    gpus = torch.cuda.device_count()
    if name == "our DDP":
        return DistributedDataParallel(model)
    if name == "torch DDP":
        return TorchDDP(model, device_ids=None if device().index is None else [device().index])
    if name == "our DataParallel":
        return DataParallel(model, device_ids=list(range(gpus)) if gpus > 1 else ["cpu"] * replicas)
    if name == "torch DataParallel":
        return torch.nn.DataParallel(model)
    return model  # the single process; average_gradients is called by hand after backward


class Way:
    # One way to train: its model and optimizer, and what we measure while it trains.

    def __init__(self, name, replicas):
        self.name, self.distributed = name, name in DISTRIBUTED
        self.rank, self.ranks = world() if self.distributed else (0, 1)
        gpus = torch.cuda.device_count()
        self.home = device() if self.distributed else "cuda" if gpus > 1 else "cpu"
        torch.manual_seed(0)  # the same start for every way
        self.model = Net().to(self.home).eval()  # eval: dropout off (see the docstring)
        self.wrapped = wrap(name, self.model, replicas)
        self.opt = SGD(self.model.parameters(), lr=0.01, momentum=0.5)
        self.losses, self.times = [], []

    def step(self, i, x, y):
        x, y = (t.chunk(self.ranks)[self.rank].to(self.home) for t in (x, y))  # my slice
        if self.distributed:
            dist.barrier()  # a distributed step lasts from its first rank's start to its last
        start = time.perf_counter()
        self.opt.zero_grad()
        loss = F.nll_loss(self.wrapped(x), y)
        loss.backward()
        if self.name == "average_gradients":
            average_gradients(self.model)
        self.times.append(time.perf_counter() - start)
        if i == 0:
            self.first_grads = [p.grad.detach().cpu().clone() for p in self.model.parameters()]
        self.opt.step()
        if i + 1 == EARLY:
            self.early = [p.detach().cpu().clone() for p in self.model.parameters()]
        self.losses.append(loss.item())

    def result(self, test):
        losses = torch.tensor(self.losses, dtype=torch.float64, device=device())
        times = torch.tensor(self.times[1:], dtype=torch.float64, device=device())  # 1: warm-up
        if self.distributed:  # the global batch's loss; a step lasts until its slowest rank
            dist.all_reduce(losses)
            dist.all_reduce(times, op=dist.ReduceOp.MAX)
        step = statistics.median(times.tolist() or [float("nan")])
        return {"strategy": self.name, "processes": self.ranks, "first_grads": self.first_grads,
                "early": self.early, "weights": [p.detach().cpu() for p in self.model.parameters()],
                "losses": (losses / self.ranks).tolist(), "step_ms": 1e3 * step,
                "accuracy": evaluate(self.model, test)["accuracy"],
                "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}  # KiB


def run(rank, world_size, args, names=DISTRIBUTED):
    # The same global batches for every way in `names`, taking turns: on every rank for the
    # distributed ways, and called plainly (rank 0 of 1) for the one-process ways.
    # TF32 off (see the docstring): a GPU's float32 must compare with the CPU's within 1e-5
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    train = get_dataset("auto", quiet=dist.is_initialized())  # says which dataset and why, once
    test = get_dataset("auto", train=False, quiet=True)
    test = TensorDataset(*(t[:500 if args.quick else None] for t in test.tensors))
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(0))
    order = order[:960 if args.quick else len(order) // GLOBAL_BATCH * GLOBAL_BATCH]
    ways = [Way(name, args.world_size) for name in names]
    for i, idx in enumerate(order.split(GLOBAL_BATCH)):
        k = i % len(ways)
        for way in ways[k:] + ways[:k]:  # take turns, the order rotating every step
            way.step(i, *train[idx])
    return [way.result(test) for way in ways]


def report(results, save):
    single, theirs = results[0], next(r for r in results if r["strategy"] == "torch DDP")
    rows = [{"strategy": r["strategy"], "processes": r["processes"],
             "max_grad_diff": max_diff(r["first_grads"], single["first_grads"]),
             "max_weight_diff_early": max_diff(r["early"], single["early"]),
             "max_weight_diff": max_diff(r["weights"], single["weights"]),
             "vs_torch_ddp": max_diff(r["weights"], theirs["weights"]),
             "steps": len(r["losses"]), "final_loss": r["losses"][-1],
             **{k: r[k] for k in ("accuracy", "step_ms", "peak_mib")},
             "memory": "cumulative"} for r in results]
    log(f"\n{'way':19s} procs  largest difference: grads step 1, weights step {EARLY}, end, "
        "vs torch DDP   test acc.  ms/step  peak MiB")
    for r in rows:
        log(f"{r['strategy']:19s} {r['processes']:5d}  {r['max_grad_diff']:8.1e} "
            f"{r['max_weight_diff_early']:8.1e} {r['max_weight_diff']:8.1e} "
            f"{r['vs_torch_ddp']:8.1e}     {r['accuracy']:7.2%} {r['step_ms']:8.2f} "
            f"{r['peak_mib']:9.0f}")
    for r in rows[1:]:
        log(check(f"{r['strategy']}: gradients at step 1 vs single process", r["max_grad_diff"],
                  1e-5))
        log(check(f"{r['strategy']}: weights after {EARLY} steps vs single",
                  r["max_weight_diff_early"], 1e-5))
    log(f"after all {rows[0]['steps']} steps the weights differ by up to "
        f"{max(r['max_weight_diff'] for r in rows):.1e}: the same rounding, amplified (a ReLU or "
        "max-pool tips the other way); see the accuracies.")
    if save:
        curves = write_csv("comparison_loss", [{"strategy": r["strategy"], "step": i, "loss": v}
                                               for r in results for i, v in enumerate(r["losses"])])
        log(f"wrote {write_csv('comparison', rows)} and {curves}; the benchmark draws them\n"
            "(README, Figures: --redraw comparison)")


def main():
    args = lesson_parser(__doc__, save_figures=True).parse_args()
    per_rank_batch(GLOBAL_BATCH, args.world_size)  # a clear error, before anything starts
    log(f"training {', '.join(DISTRIBUTED)} on {args.world_size} ranks, then the one-process "
        "ways here")
    results = launch(run, args.world_size, args, backend=args.backend)
    if results is not None:  # then the one-process ways, here, side by side on one thread each
        torch.set_num_threads(1)
        local = ["single process", "our DataParallel"]
        local += ["torch DataParallel"] * (torch.cuda.device_count() > 1)
        local = run(0, 1, args, local)
        report(local[:1] + results[0] + local[1:], args.save_figures)  # lessons 06-09's order


if __name__ == "__main__":
    main()
