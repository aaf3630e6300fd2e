"""Lesson 06: distributed synchronous SGD, written by hand.

Every rank holds a full copy of the model (the classic MNIST convnet, dist_sgd.sgd.models.Net)
and its own shard of the data (lesson 05). One step, on every rank (train_step below):

    loss = F.nll_loss(model(x_local), y_local)   # the mean over this rank's b items
    loss.backward()                              # the gradient of this rank's mean loss
    average_gradients(model)                     # all-reduce SUM, then / world size
    optimizer.step()                             # our SGD: the same update on every rank

Why the loss is averaged this way: the global batch of B items is split into R equal local
batches of b = B / R. The mean loss over the global batch is the mean of the R local means,
and so is its gradient: "mean over the local batch, then average over ranks" is exactly
"mean over the global batch", the gradient one process would compute on all B items. That
needs equal local batches, which is why ShardSampler pads every shard to the same length and
why B must divide by R (per_rank_batch stops with a clear error otherwise). Since every rank
then applies the same averaged gradient to the same weights, the replicas stay identical
without ever sending a weight again.

The GLOBAL batch stays fixed (64, as in the old example) at every world size, so every world
size trains with the same learning rate and even sees the same 64 items per step (the
sampler's strided split makes step t's global batch the same set of items for any R); only
dropout's random masks and float rounding differ, and accuracy agrees within noise.

What it checks, against one process on the whole global batch:
  (a) at the first step the averaged gradient equals the single-process gradient,
  (b) after several steps the weights equal single-process SGD's,
  (c) every rank holds identical weights (max difference exactly 0), also after training,
  (d) gradient accumulation: k micro-batches give the same update as one k times larger batch.
(a), (b) and (d) run in float64 with dropout off (eval mode): R processes draw other dropout
masks than one process does, so with dropout on the gradients differ by chance, not by a bug.
float64 makes "equal" mean ~1e-16; float32 gives ~1e-8, the rounding of adding the same
numbers in another order. Then it trains and tests, and times the epoch.

More ranks are not faster on a 2-core laptop: a smaller per-rank batch does not shrink the
per-step costs (Python, operator dispatch, 8 all-reduces per step), and with more ranks than
cores each all-reduce waits for a rank that is not running (the "sync" share printed).

Run:
    python lessons/06_distributed_sgd.py --world-size 2
    python lessons/06_distributed_sgd.py --world-size 1 2 4 --epochs 2   # the README table
    torchrun --standalone --nproc-per-node 2 lessons/06_distributed_sgd.py

Exercises:
  0. Write average_gradients yourself: `python3 -m dist_sgd.course start average_gradients`,
     then `python3 -m dist_sgd.course check average_gradients` grades it against one process
     at world sizes 1-4 (frozen, unused and tied parameters), and `DIST_SGD_MINE=mine python3
     lessons/06_distributed_sgd.py` trains this lesson on yours.
  1. Keep 64 items per rank (--batch-size 64 x world size) with lr 0.01: what happens to
     accuracy after one epoch? Then scale lr with dist_sgd.sgd.train.scaled_lr (the linear
     scaling rule of Goyal et al. 2017, "Accurate, Large Minibatch SGD"), with warm-up.
  2. Use a summed loss (reduction="sum") with average_gradients: by what factor is the update
     off? What should average_gradients divide by instead?
  3. Run the checks in train mode (dropout on): how large is the difference now, and why?
  4. Try --batch-size 64 --world-size 3: what does per_rank_batch say?
  5. Write the SGD update yourself: `python3 -m dist_sgd.course start SGD` (momentum,
     dampening, Nesterov, weight decay, maximize); `python3 -m dist_sgd.course check SGD`
     compares it with torch.optim.SGD step by step, and `DIST_SGD_MINE=mine python3
     lessons/06_distributed_sgd.py` trains this lesson with it.
"""
import copy
import time

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from dist_sgd.plumbing.check import check, max_diff
from dist_sgd.sgd.data import get_dataset
from dist_sgd.plumbing.launch import launch, lesson_parser
from dist_sgd.plumbing.rank import device, log
from dist_sgd.sgd.models import Net
from dist_sgd.sgd.optim import SGD
from dist_sgd.sgd.sync import average_gradients, broadcast_parameters
from dist_sgd.sgd.train import (evaluate, format_test, max_diff_across_ranks, per_rank_batch,
                                shard_loader)

LR, MOMENTUM, SEED = 0.01, 0.5, 1  # the old example's settings
CHECK_STEPS, MICRO_BATCHES = 5, 4


def train_step(model, optimizer, x, y):
    """One step of synchronous SGD on this rank; returns the seconds spent averaging."""
    optimizer.zero_grad()
    loss = F.nll_loss(model(x), y)  # the mean over this rank's items
    loss.backward()
    start = time.perf_counter()
    average_gradients(model)  # now every rank holds the gradient of the global batch
    synced = time.perf_counter() - start
    optimizer.step()
    return synced


def check_against_one_process(rank, world_size, model, images, labels, batch):
    """(a), (b), (c): R ranks with train_step vs one process on each whole global batch."""
    ref, mine = (copy.deepcopy(model).double().eval() for _ in range(2))  # dropout off
    opt_ref = SGD(ref.parameters(), lr=LR, momentum=MOMENTUM)
    opt = SGD(mine.parameters(), lr=LR, momentum=MOMENTUM)
    for step in range(CHECK_STEPS):
        here = slice(step * batch, (step + 1) * batch)  # this step's global batch
        x, y = images[here].to(device(), torch.float64), labels[here].to(device())
        opt_ref.zero_grad()
        F.nll_loss(ref(x), y).backward()  # one process: the mean over all B items
        opt_ref.step()
        # This rank's share, as ShardSampler hands it out: positions rank, rank + R, ...
        train_step(mine, opt, x[rank::world_size], y[rank::world_size])
        if step == 0:
            log(check("(a) first step: averaged gradient vs one process on the global batch",
                      max_diff([p.grad for p in mine.parameters()],
                               [p.grad for p in ref.parameters()]), 1e-12))
    log(check(f"(b) weights after {CHECK_STEPS} steps vs one process", max_diff(mine, ref), 1e-12))
    log(check("(c) weights across ranks", max_diff_across_ranks(mine), 0))


def check_accumulation(rank, world_size, model, images, labels, batch, k=MICRO_BATCHES):
    """(d) k micro-batches of b per rank, loss / k each, one average_gradients, one step
    == one step on a batch of k * B items in one process."""
    x, y = images[:k * batch].to(device(), torch.float64), labels[:k * batch].to(device())
    big, acc = (copy.deepcopy(model).double().eval() for _ in range(2))
    opt_big, opt_acc = SGD(big.parameters(), lr=LR), SGD(acc.parameters(), lr=LR)
    F.nll_loss(big(x), y).backward()
    opt_big.step()
    b = per_rank_batch(batch, world_size)
    for xm, ym in zip(x[rank::world_size].split(b), y[rank::world_size].split(b)):
        # Each micro loss is a mean over b items; the big batch's mean is the mean of the k
        # micro means, hence / k. backward() adds into .grad until zero_grad().
        (F.nll_loss(acc(xm), ym) / k).backward()
    average_gradients(acc)  # once per k micro-batches: k times less communication
    opt_acc.step()
    log(check(f"(d) {k} micro-batches vs one batch of {k * batch} in one process",
              max_diff(acc, big), 1e-12))


def run(rank, world_size, args):
    train = get_dataset(args.dataset, quiet=True)
    test = get_dataset(args.dataset, train=False, quiet=True)
    if args.quick:  # a slice keeps --quick short; same code path otherwise
        train = TensorDataset(*(t[:3072] for t in train.tensors))
        test = TensorDataset(*(t[:1000] for t in test.tensors))
    batch, b = args.batch_size, per_rank_batch(args.batch_size, world_size)
    log(f"\n=== world size {world_size}: global batch {batch} = {world_size} x {b} items ===")
    torch.manual_seed(SEED + rank)  # each rank initializes its own, different, random model
    model = Net().to(device())
    before = max_diff_across_ranks(model)
    broadcast_parameters(model, src=0)  # ... and then takes rank 0's weights
    log(f"initial weights: max difference across ranks {before:.3g} before broadcast_parameters")
    log(check("initial weights across ranks after broadcast_parameters",
              max_diff_across_ranks(model), 0))
    torch.manual_seed(SEED + 1000 + rank)  # dropout masks: independent draws on every rank
    check_against_one_process(rank, world_size, model, *train.tensors, batch)
    check_accumulation(rank, world_size, model, *train.tensors, batch)

    log(f"training: SGD lr {LR}, momentum {MOMENTUM}, dropout on, {len(train)} items per epoch")
    loader = shard_loader(train, batch, seed=SEED)  # this rank's shard, b items per step
    optimizer = SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    row = {"world_size": world_size, "b": b, "epochs": []}
    for epoch in range(1, args.epochs + 1):
        loader.sampler.set_epoch(epoch)  # a new shuffle, the same on every rank
        model.train()
        start, synced = time.perf_counter(), 0.0
        for x, y in loader:
            synced += train_step(model, optimizer, x.to(device()), y.to(device()))
        seconds = time.perf_counter() - start
        result = evaluate(model, test)  # every rank tests a share; the sums are all-reduced
        log(f"epoch {epoch}: {seconds:.2f} s, {100 * synced / seconds:.0f}% of it in "
            f"average_gradients (sending, and waiting for the slowest rank). {format_test(result)}")
        row["epochs"].append((result["accuracy"], seconds, synced / seconds))
    log(check("(c) weights across ranks after training", max_diff_across_ranks(model), 0))
    return row


def main():
    parser = lesson_parser(__doc__, world_size=[2])  # several sizes, one after another: a table
    parser.add_argument("--epochs", type=int, default=None, help="default 2 (1 with --quick)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="GLOBAL batch, split over the ranks (default 64; 48 with --quick)")
    args = parser.parse_args()
    args.epochs = args.epochs or (1 if args.quick else 2)
    args.batch_size = args.batch_size or (48 if args.quick else 64)
    args.dataset = get_dataset("auto").name  # says which dataset and why
    for ws in args.world_size:
        try:
            per_rank_batch(args.batch_size, ws)
        except ValueError as e:
            parser.error(str(e))  # before starting anything
    rows = []
    for ws in args.world_size:
        results = launch(run, ws, args, backend=args.backend)
        if results is not None:  # the process that reports: every rank's row, by rank
            rows.append(results[0])
    if len(rows) > 1:
        log(f"\nsummary ({args.dataset}, global batch {args.batch_size}; times on this machine):")
        log("world size | per-rank batch | accuracy, s/epoch, sync share per epoch")
        for r in rows:
            log(f"{r['world_size']:>10} | {r['b']:>14} | " + " | ".join(
                f"{100 * a:6.2f}% {s:7.2f} s {100 * c:3.0f}%" for a, s, c in r["epochs"]))


if __name__ == "__main__":
    main()
