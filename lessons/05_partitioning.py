"""Lesson 05: partitioning the dataset - every rank trains on its own shard.

Data-parallel training runs the same model on every rank, each on different data. So before
any gradient is averaged, the data must be split: every rank needs its own part, the parts
must not overlap (or ranks repeat each other's work) and together must cover the data (or
some items are never seen).

1. The PyTorch tutorial's DataPartitioner: shuffle the indices once with a seed that every
   rank shares (so every rank computes the *same* shuffle without talking), cut them into
   world_size parts, and take part `rank`.
2. A sampler, as real code does it: dist_sgd.sgd.partition.ShardSampler, which yields index for
   index what torch.utils.data.distributed.DistributedSampler yields. Each epoch it draws one
   permutation seeded with seed + epoch (set_epoch!), pads it by repeating its first indices
   until it splits evenly (so that every rank runs the same number of steps: a rank that
   runs out early would leave its peers waiting in an all-reduce), and rank r takes every
   world_size-th index from position r. With drop_last=True it cuts the tail instead.
3. The classic bug of the old gloo MNIST example: it creates a DistributedSampler and then
   builds its DataLoader with shuffle=True instead of sampler=train_sampler. Nothing fails
   and nothing warns; every rank just trains on the whole dataset, so one "epoch" costs
   world_size times the work. We detect it and count and time what it costs. (Without a
   GPU that example did not even wrap the model in DistributedDataParallel: its ranks
   trained independent models, each on all the data - no distributed training at all.)

Run:
    python lessons/05_partitioning.py --world-size 2
    python lessons/05_partitioning.py --world-size 4 --quick
    torchrun --standalone --nproc-per-node 2 lessons/05_partitioning.py

Exercises:
  0. Write ShardSampler yourself: `python3 -m dist_sgd.course start ShardSampler`, then
     `python3 -m dist_sgd.course check ShardSampler` compares it, index for index, with
     DistributedSampler at world sizes 1-4 (shuffled or not, padded or drop_last, two
     epochs), and `DIST_SGD_MINE=mine python3 lessons/05_partitioning.py` runs this lesson on it.
  1. Give one rank a different seed (ShardSampler(..., seed=rank)): what does the shard
     report say now? Why must the seed be the same everywhere?
  2. Forget sampler.set_epoch(epoch): print two epochs' shards. What stays the same?
  3. With 10 items and 4 ranks, which items count twice per epoch without drop_last? How
     much does that bias the gradient, and why does evaluation use an unpadded split?
  4. Change DataPartitioner's cut points back to the tutorial's int(frac * len): how many
     items go missing with 7 ranks and 60,000 items?
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, Subset, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from dist_sgd.plumbing.check import check, max_diff
from dist_sgd.sgd.data import get_dataset
from dist_sgd.plumbing.launch import launch, lesson_parser
from dist_sgd.plumbing.rank import device, log, rank_print
from dist_sgd.sgd.models import Net
from dist_sgd.sgd.optim import SGD
from dist_sgd.sgd.partition import (DataPartitioner, ShardSampler, check_sharded,
                                is_sharded, loader_indices, shard_report)
from dist_sgd.sgd.sync import average_gradients
from dist_sgd.plumbing.timing import summarize, time_alternating


def in_rank_order(fn):
    """Let rank 0 print, then rank 1, ...: per-rank lines in a readable order."""
    for r in range(dist.get_world_size()):
        if r == dist.get_rank():
            fn()
        dist.barrier()


def gather(obj):
    """Every rank's object, as a list indexed by rank (the same list on every rank)."""
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def report_line(report, n):
    return (f"{report['visits']} visits of {n} items: {report['unique']} distinct, "
            f"{report['repeats']} repeated, {report['missing']} missing, "
            f"disjoint={report['pairwise_disjoint']}")


def partitioner_part(rank, world_size, n):
    log(f"\n== 1. The tutorial's DataPartitioner: {n} items in {world_size} parts ==")
    parts = DataPartitioner(list(range(n)), [1.0 / world_size] * world_size, seed=1234)
    mine = parts.use(rank)
    in_rank_order(lambda: rank_print(f"partition {rank}: {len(mine)} items, first "
                                     f"{mine.index[:6]}"))
    report = shard_report(gather(mine.index), n)
    log("together:", report_line(report, n))
    log(check("DataPartitioner: items left out or in two parts", report["missing"] +
              report["repeats"], 0))
    log("(the tutorial then uses batch size 128 / float(size): a float batch size. We use an "
        "integer per-rank batch, see lesson 06.)")


def sampler_part(rank, world_size, dataset, name):
    log("\n== 2. ShardSampler vs torch's DistributedSampler ==")
    worst = off = 0
    toy = 10 if 10 % world_size else 11  # a size that does not split evenly: padding shows
    for data, label in ((TensorDataset(torch.arange(toy)), f"toy set of {toy} items"),
                        (dataset, f"{name} training set")):
        for drop_last in (False, True):
            show = label.startswith("toy")
            log(f"-- {label}, drop_last={drop_last}")
            shards = []
            for epoch in (0, 1):
                ours = ShardSampler(data, drop_last=drop_last)  # world size, rank: from the group
                theirs = DistributedSampler(data, drop_last=drop_last)
                ours.set_epoch(epoch)
                theirs.set_epoch(epoch)
                a, b = torch.tensor(list(ours)), torch.tensor(list(theirs))
                worst = max(worst, max_diff(a, b))  # also fails if the lengths differ
                if show:
                    in_rank_order(lambda: rank_print(f"epoch {epoch}: shard {a.tolist()}"))
                shards.append(a.tolist())
            report = shard_report(gather(shards[0]), len(data))
            log("   epoch 0 together:", report_line(report, len(data)))
            if show and not drop_last:
                everything = sum(gather(shards[0]), [])
                twice = sorted({i for i in everything if everything.count(i) > 1})
                log(f"   counted twice this epoch (the padding): items {twice}")
            # Padded: every item, the first (total - n) twice; cut: n % R items left out.
            repeats, missing = (0, len(data) % world_size) if drop_last else \
                (ours.total_size - len(data), 0)
            off = max(off, abs(report["repeats"] - repeats) + abs(report["missing"] - missing))
    log("padding: without drop_last the first (total - n) indices of the permutation are "
        "repeated, so a few items count twice per epoch; drop_last skips a few instead.")
    log(check("ShardSampler vs DistributedSampler, indices in every case", worst, 0))
    log(check("items repeated and left out, vs the padding or the cut", off, 0))


def one_epoch(model, loader, opt):
    for x, y in loader:
        x, y = x.to(device()), y.to(device())
        opt.zero_grad()
        F.nll_loss(model(x), y).backward()
        average_gradients(model)
        opt.step()


def bug_part(rank, world_size, dataset, quick):
    n = 256 if quick else 2048
    subset = Subset(dataset, range(n))
    batch = 32
    log(f"\n== 3. The old example's bug, on the first {n} items ==")
    log("   train_sampler = DistributedSampler(train_dataset)")
    log("   train_loader = DataLoader(train_dataset, batch_size=32, shuffle=True)"
        "  # sampler never passed!")
    torch.manual_seed(rank)  # like the example: each rank shuffles with its own random state
    buggy = DataLoader(subset, batch_size=batch, shuffle=True)
    fixed = DataLoader(subset, batch_size=batch, sampler=ShardSampler(subset))
    log(f"is_sharded(buggy) = {is_sharded(buggy)}, is_sharded(fixed) = {is_sharded(fixed)}")
    try:
        check_sharded(buggy)
    except ValueError as e:
        log(f"check_sharded(buggy) raises: {e}")
    for label, loader in (("buggy", buggy), ("fixed", fixed)):
        report = shard_report(gather(loader_indices(loader)), n)
        log(f"{label}: {len(loader)} steps per rank per epoch; " + report_line(report, n))
    model = Net().to(device())
    opt = SGD(model.parameters(), lr=0.01, momentum=0.5)
    # Interleaved (fixed, buggy, fixed, ...), each sample the slowest rank, medians reported.
    samples = time_alternating({"fixed": lambda: one_epoch(model, fixed, opt),
                                "buggy": lambda: one_epoch(model, buggy, opt)},
                               repeats=2 if quick else 4, warmup=0 if quick else 1)
    timed = {k: summarize(v)["median"] for k, v in samples.items()}
    log(f"one epoch of Net on {n} items (median of {len(samples['fixed'])}): "
        f"fixed {timed['fixed']:.3f} s, "
        f"buggy {timed['buggy']:.3f} s -> {timed['buggy'] / timed['fixed']:.2f}x "
        f"(the count predicts {world_size}x"
        f"{'; --quick: too few steps to time well' if quick else ''})")


def run(rank, world_size, args):
    dataset = get_dataset(args.dataset, quiet=True)
    partitioner_part(rank, world_size, 20 if args.quick else len(dataset))
    sampler_part(rank, world_size, dataset, args.dataset)
    bug_part(rank, world_size, dataset, args.quick)


def main():
    args = lesson_parser(__doc__).parse_args()
    args.dataset = get_dataset("auto").name  # says which and why; the ranks load it quietly
    launch(run, args.world_size, args, backend=args.backend)
    log("\n" + __doc__[__doc__.index("Exercises:"):].rstrip())


if __name__ == "__main__":
    main()
