"""Lesson 06: distributed synchronous SGD, written by hand.

Every rank holds a full copy of the model (the classic MNIST convnet, dist_sgd.models.Net)
and its own shard of the data (lesson 05). One step, on every rank:

    loss = F.nll_loss(model(x_local), y_local)   # the mean over this rank's b items
    loss.backward()                              # the gradient of this rank's mean loss
    average_gradients(model)                     # all-reduce SUM, then / world size
    optimizer.step()                             # our SGD: the same update on every rank

Why the loss is averaged this way: the global batch of B items is split into R equal local
batches of b = B / R. The mean loss over the global batch is the mean of the R local means,
and so is its gradient: "mean over the local batch, then average over ranks" is exactly
"mean over the global batch" - the gradient one process would compute on all B items. That
needs equal local batches, which is why ShardSampler pads every shard to the same length and
why the per-rank batch must be an integer: B must divide by R (or the lesson stops with a
clear error). Since every rank then applies the same averaged gradient to the same weights,
the replicas stay identical without ever sending a weight again.

This lesson holds the GLOBAL batch fixed (64, as in the old example) at world sizes 1, 2 and
4, so every world size trains with the same learning rate and even sees the same 64 items
per step (the sampler's strided split makes step t's global batch the same set of items for
any R); only dropout's random masks and float rounding differ. Accuracy should agree within
noise. If you instead keep the per-rank batch fixed and add ranks, the global batch grows,
and the linear scaling rule (Goyal et al. 2017, "Accurate, Large Minibatch SGD") says: scale
the learning rate by the same factor, lr = base_lr * B / B_base, and reach it by a gradual
warm-up over the first epochs, because a large lr on a freshly initialized net diverges.

What it checks (against a single process, max differences printed):
  (a) at the first step the averaged gradient equals the single-process full-batch gradient,
  (b) after several steps every rank holds identical weights, equal to single-process SGD,
  (c) accuracy and time per epoch, in the old example's log format,
  (d) gradient accumulation: k micro-batches give the same update as one k times larger batch.
(a), (b) and (d) run in float64 with dropout off (eval mode): dropout draws random masks, and
R processes draw different masks than one process does, so with dropout on the gradients
differ by chance, not by a bug. float64 makes "equal" mean ~1e-16; float32 gives ~1e-8,
the rounding of adding the same numbers in another order.

Run:
    python lessons/06_distributed_sgd.py --world-size 2
    python lessons/06_distributed_sgd.py --world-sizes 1 2 4 --epochs 2   # the README table
    torchrun --standalone --nproc-per-node 2 lessons/06_distributed_sgd.py

Exercises:
  1. Keep 64 items per rank (--batch-size 64 x world size) with lr 0.01: what happens to
     accuracy after one epoch? Then scale lr with dist_sgd.train.scaled_lr, with warm-up.
  2. Use a summed loss (reduction="sum") with average_gradients: by what factor is the update
     off? What should average_gradients divide by instead?
  3. Run the checks in train mode (dropout on): how large is the difference now, and why?
  4. Time average_gradients(model, flat=True) against the per-parameter version (8 calls).
"""
import copy
import os
import sys

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from dist_sgd.data import get_dataset  # noqa: E402
from dist_sgd.launch import device, launch, lesson_parser, log, under_torchrun  # noqa: E402
from dist_sgd.models import Net  # noqa: E402
from dist_sgd.optim import SGD  # noqa: E402
from dist_sgd.sync import average_gradients, broadcast_parameters  # noqa: E402
from dist_sgd.train import (evaluate, format_epoch, format_test,  # noqa: E402
                            max_diff_across_ranks, per_rank_batch, scaled_lr, shard_loader,
                            train_epoch)

LR, MOMENTUM, SEED = 0.01, 0.5, 1  # the old example's settings
CHECK_STEPS, MICRO_BATCHES = 5, 4


def max_diff(xs, ys):
    return max((x - y).abs().max().item() for x, y in zip(xs, ys, strict=True))


def check_equivalence(rank, world_size, model, train, batch, dtype=torch.float64,
                      steps=CHECK_STEPS):
    """(a) and (b): R ranks with average_gradients vs one process on the whole global batch."""
    images, labels = train.tensors
    ref = copy.deepcopy(model).to(dtype).eval()  # eval: dropout off (see the docstring)
    mine = copy.deepcopy(model).to(dtype).eval()
    opt_ref = SGD(ref.parameters(), lr=LR, momentum=MOMENTUM)
    opt = SGD(mine.parameters(), lr=LR, momentum=MOMENTUM)
    grad_diff = None
    for step in range(steps):
        here = slice(step * batch, (step + 1) * batch)  # this step's global batch
        x, y = images[here].to(device(), dtype), labels[here].to(device())
        opt_ref.zero_grad()
        F.nll_loss(ref(x), y).backward()  # one process: the mean over all B items
        opt.zero_grad()
        # This rank's share, as ShardSampler hands it out: positions rank, rank + R, ...
        F.nll_loss(mine(x[rank::world_size]), y[rank::world_size]).backward()
        average_gradients(mine)
        if grad_diff is None:
            want, got = [p.grad for p in ref.parameters()], [p.grad for p in mine.parameters()]
            torch.testing.assert_close(got, want)
            grad_diff = max_diff(got, want)
        opt_ref.step()
        opt.step()
    torch.testing.assert_close(list(mine.parameters()), list(ref.parameters()))
    return grad_diff, max_diff(mine.parameters(), ref.parameters()), max_diff_across_ranks(mine)


def check_accumulation(rank, world_size, model, train, batch, k=MICRO_BATCHES):
    """(d) k micro-batches of b per rank, loss / k each, one average_gradients, one step
    == one step on a single batch of k * B items in one process."""
    images, labels = train.tensors
    x, y = images[:k * batch].to(device(), torch.float64), labels[:k * batch].to(device())
    big, acc = copy.deepcopy(model).double().eval(), copy.deepcopy(model).double().eval()
    opt_big, opt_acc = SGD(big.parameters(), lr=LR), SGD(acc.parameters(), lr=LR)
    F.nll_loss(big(x), y).backward()
    opt_big.step()
    xl, yl = x[rank::world_size], y[rank::world_size]  # k * b items on this rank
    b = per_rank_batch(batch, world_size)
    for xm, ym in zip(xl.split(b), yl.split(b)):
        # Each micro loss is a mean over b items; the big batch's mean is the mean of the k
        # micro means, hence / k. backward() adds into .grad until zero_grad().
        (F.nll_loss(acc(xm), ym) / k).backward()
    average_gradients(acc)  # once per k micro-batches: k times less communication
    opt_acc.step()
    torch.testing.assert_close(list(acc.parameters()), list(big.parameters()))
    return max_diff(acc.parameters(), big.parameters())


def run(rank, world_size, cfg):
    train = get_dataset(cfg["dataset"], quiet=True)
    test = get_dataset(cfg["dataset"], train=False, quiet=True)
    if cfg["quick"]:  # a slice keeps --quick under ~20 s; same code path otherwise
        train = TensorDataset(*(t[:3072] for t in train.tensors))
        test = TensorDataset(*(t[:1000] for t in test.tensors))
    batch = cfg["batch"]
    b = per_rank_batch(batch, world_size)
    log(f"\n=== world size {world_size}: global batch {batch} = {world_size} "
        f"rank{'s' if world_size > 1 else ''} x {b} items ===")

    torch.manual_seed(SEED + rank)  # each rank initializes its own, different, random model
    model = Net().to(device())  # this rank's GPU under NCCL, else the CPU
    before = max_diff_across_ranks(model)
    broadcast_parameters(model, src=0)  # ... and then takes rank 0's weights
    log(f"initial weights: max diff across ranks {before:.3g} before broadcast_parameters, "
        f"{max_diff_across_ranks(model):.3g} after")
    torch.manual_seed(SEED + 1000 + rank)  # dropout masks: independent draws on every rank

    grad64, weight64, ranks64 = check_equivalence(rank, world_size, model, train, batch)
    grad32, _, _ = check_equivalence(rank, world_size, model, train, batch, torch.float32, steps=1)
    log(f"(a) first step, averaged gradient vs single-process full-batch gradient: max diff "
        f"{grad64:.3g} (float64), {grad32:.3g} (float32: rounding only)")
    log(f"(b) after {CHECK_STEPS} steps: weights vs single-process SGD max diff {weight64:.3g}; "
        f"across ranks max diff {ranks64:.3g}")
    assert ranks64 == 0.0
    acc = check_accumulation(rank, world_size, model, train, batch)
    log(f"(d) {MICRO_BATCHES} micro-batches of {b} per rank vs one batch of "
        f"{MICRO_BATCHES * batch} in one process: weights after the step max diff {acc:.3g}")

    log(f"(c) training: SGD lr {LR}, momentum {MOMENTUM}, {cfg['epochs']} epoch(s) of "
        f"{len(train)} items, test on {len(test)}")
    loader = shard_loader(train, batch, seed=SEED)
    opt = SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    out = {"world_size": world_size, "b": b, "acc": [], "loss": [], "seconds": [],
           "sync": []}
    for epoch in range(1, cfg["epochs"] + 1):
        loader.sampler.set_epoch(epoch)  # a new shuffle, the same on every rank
        stats = train_epoch(model, loader, opt, epoch, log_interval=max(1, len(loader) // 4))
        log(format_epoch(epoch, cfg["epochs"], stats["seconds"]))
        share = stats["sync_seconds"] / stats["seconds"]
        log(f"  of which {stats['sync_seconds']:.3f}s ({100 * share:.0f}%) in average_gradients "
            f"(communicating, and waiting for the slowest rank)")
        result = evaluate(model, test)
        note = " (--quick: a few dozen steps, far from trained)" if cfg["quick"] else ""
        log(format_test(result) + note + "\n")
        out["acc"].append(result["accuracy"])
        out["loss"].append(result["loss"])
        out["seconds"].append(stats["seconds"])
        out["sync"].append(share)
    out["rank_diff"] = max_diff_across_ranks(model)
    log(f"after training (float32, dropout on): weights max diff across ranks "
        f"{out['rank_diff']:.3g}")
    assert out["rank_diff"] == 0.0, "replicas drifted apart"
    return out


def main():
    parser = lesson_parser(__doc__)
    parser.add_argument("--world-sizes", type=int, nargs="+", metavar="R",
                        help="run these world sizes one after another, e.g. 1 2 4 "
                             "(a table at the end)")
    parser.add_argument("--epochs", type=int, default=None, help="default 2 (1 with --quick)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="GLOBAL batch, split evenly over the ranks "
                             "(default 64; 48 with --quick)")
    args = parser.parse_args()
    world_sizes = args.world_sizes or [args.world_size]
    if under_torchrun():
        world_sizes = [int(os.environ["WORLD_SIZE"])]
    cfg = {"quick": args.quick, "epochs": args.epochs or (1 if args.quick else 2),
           "batch": args.batch_size or (48 if args.quick else 64)}
    for ws in world_sizes:
        try:
            per_rank_batch(cfg["batch"], ws)
        except ValueError as e:
            parser.error(str(e))  # before spawning anything
    is_rank0 = os.environ.get("RANK", "0") == "0"
    cfg["dataset"] = get_dataset("auto").name  # says which dataset and why
    if is_rank0:
        try:
            per_rank_batch(64, 3)
        except ValueError as e:
            print(f"(a global batch must divide: per_rank_batch(64, 3) says: {e})")
        print(f"(linear scaling rule: with 64 per rank on 4 ranks the global batch is 256, so "
              f"lr {LR} -> {scaled_lr(LR, 64, 256):g}, ramped up over the warm-up, e.g. step 100 "
              f"of 500: {scaled_lr(LR, 64, 256, step=100, warmup_steps=500):g})")
    rows = [launch(run, ws, cfg, backend=args.backend)[0] for ws in world_sizes]
    if is_rank0:
        print(f"\nsummary ({cfg['dataset']}, global batch {cfg['batch']}; times on this machine):")
        print("world size | per-rank batch | " + " | ".join(
            f"acc ep {e + 1} | s/epoch {e + 1} | sync" for e in range(cfg["epochs"]))
            + " | rank max diff")
        for r in rows:
            print(f"{r['world_size']:>10} | {r['b']:>14} | " + " | ".join(
                f"{100 * a:7.2f}% | {s:9.2f} | {100 * c:3.0f}%"
                for a, s, c in zip(r["acc"], r["seconds"], r["sync"]))
                + f" | {r['rank_diff']:.3g}")
        if len(rows) > 1:
            print(f"\nWhy more ranks are not faster here: this machine has {os.cpu_count()} cores, "
                  "shared with whatever else runs. Each rank computes on a smaller batch, but "
                  "the per-step costs that do not shrink with the batch (Python, operator "
                  "dispatch, the all-reduces) stay, and with more ranks than cores the ranks "
                  "take turns, so each all-reduce also waits for a rank that is not running "
                  "('sync' column). With a core or GPU per rank and enough work per step, the "
                  "compute time falls as 1/R while communication stays small: see the cost "
                  "model in the later lessons.")
        print("\n" + __doc__[__doc__.index("Exercises:"):].rstrip())


if __name__ == "__main__":
    main()
