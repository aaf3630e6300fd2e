"""Lesson 08: DataParallel from scratch - one process, the batch split over threads.

Before DistributedDataParallel there was torch.nn.DataParallel: no process group, no
all-reduce. One process splits each batch over its GPUs, runs a replica of the model on each
in its own thread, collects the outputs on the first GPU and runs ONE backward. The gradient
sum over replicas comes for free: the replicas' weights are autograd copies of the original
ones, so backward flows through the copies and adds every replica's gradient into the
original parameters. dist_sgd/ddp/data_parallel.py writes the four steps out:

    chunks   = scatter((x,), devices)          # the batch, split along dimension 0
    replicas = replicate(module, devices)      # shallow copies with differentiable weights
    outputs  = parallel_apply(replicas, chunks, devices)   # one thread per replica
    out      = gather(outputs, devices[0])     # concatenated: then loss and one backward

Plainly: with no GPU, torch.nn.DataParallel does none of this - it just calls the module
(device_ids is empty). Ours can run CPU replicas (device_ids=["cpu"] * N) so the four steps can
be watched and checked on a laptop, and so we can see what threads do on a CPU: torch releases
Python's global interpreter lock (GIL) inside its kernels, so two replicas' convolutions can
run at the same time on two cores, but every line of Python between kernels takes turns, and
on the CPU autograd runs the whole backward in the calling thread. That is why the CPU numbers
below show little speed-up, and part of why DDP (one process per device, no GIL to share, no
per-step replication, no first device gathering everything) replaced DataParallel.

The lesson checks that the gradients equal one process on the whole batch (max difference
printed), then times 1 replica against N replicas in threads. Dropout is off (eval mode):
the replicas' threads would draw their masks from one generator in a random order.

Ours takes torch's arguments (device_ids, output_device, dim) and follows its scatter/gather
rules: tensors in keyword arguments and in nested tuples, lists, dicts and namedtuples are split
too; a module that returns its own 0-d loss gives one loss per replica. Where ours differs from
torch's is listed in the README's "How ours differs from torch's".

Run (one process; --world-size is the number of replicas):
    python lessons/08_data_parallel.py --world-size 2
    python lessons/08_data_parallel.py --quick
    torchrun --standalone --nproc-per-node 1 lessons/08_data_parallel.py   # the same, one rank

Exercises:
  0. Write DataParallel yourself: `python3 -m dist_sgd.course start DataParallel` gives you
     scatter, gather and the forward to write, `... check DataParallel` grades them against
     one process and torch.nn.DataParallel's rules (batches that do not split evenly, tuples
     and dicts), and `DIST_SGD_MINE=mine python3 lessons/08_data_parallel.py` runs this lesson
     on yours.
  1. Run with --world-size 3 and a batch of 10: what chunk sizes does scatter choose, and why
     are the gradients still exact?
  2. Switch dropout on (model.train()) and compare with one process: why do they differ now,
     and why would two runs of DataParallel differ from each other too?
  3. Time a tiny model (dist_sgd.sgd.models.MLP, batch 8) with 1 and 4 replicas: where does the
     time go (hint: last_times, and the GIL)?
"""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

from dist_sgd.plumbing.check import check, exact_float32, max_diff
from dist_sgd.sgd.data import get_dataset
from dist_sgd.ddp.data_parallel import DataParallel, gather, parallel_apply, replicate, scatter
from dist_sgd.plumbing.launch import launch, lesson_parser
from dist_sgd.plumbing.rank import device, log
from dist_sgd.sgd.models import MLP, Net
from dist_sgd.plumbing.timing import summarize, time_alternating


def net(cls=Net):
    torch.manual_seed(0)
    return cls().eval()  # eval: dropout off (see the docstring)


def grads(model):
    return [p.grad for p in model.parameters()]


def run(rank, world_size, args):
    """One rank (this lesson needs no group); args.world_size replicas in threads."""
    replicas, quick = args.world_size, args.quick
    images, labels = get_dataset(args.dataset, quiet=True).tensors
    batch = 64
    x, y = images[:batch], labels[:batch]
    devices = [torch.device("cpu")] * replicas

    log(f"The four steps by hand, {replicas} CPU replicas, a batch of {batch}:")
    model = net()
    chunks = scatter((x,), devices)
    log(f"  scatter:        chunks of {[c[0].shape[0] for c in chunks]} images")
    copies = replicate(model, devices)
    log(f"  replicate:      {len(copies)} replicas; on the CPU each replica's conv1.weight "
        f"is the original tensor: {all(r.conv1.weight is model.conv1.weight for r in copies)}")
    outputs = parallel_apply(copies, chunks, devices)
    log(f"  parallel_apply: {len(outputs)} outputs of shapes {[tuple(o.shape) for o in outputs]}")
    out = gather(outputs, devices[0])
    log(f"  gather:         {tuple(out.shape)}; one backward from here reaches the originals")
    F.nll_loss(out, y).backward()

    single = net()
    F.nll_loss(single(x), y).backward()
    log("  " + check("gradient, four steps by hand vs one process on the whole batch",
                     max_diff(grads(model), grads(single)), 1e-5))

    model = net()
    dp = DataParallel(model, device_ids=devices)
    F.nll_loss(dp(x), y).backward()
    log("  " + check(f"gradient, DataParallel(model, device_ids={[str(d) for d in devices]}) "
                     f"vs one process", max_diff(grads(model), grads(single)), 1e-5))
    log("  phases of its forward: " + ", ".join(f"{k} {1e3 * v:.2f} ms"
                                              for k, v in dp.last_times.items()))

    exact_float32()  # a GPU: no TF32 (lesson 09); torch's DataParallel wants the module there
    dev, gpus = device(), torch.cuda.device_count() if torch.cuda.is_available() else 0
    theirs, plain = nn.DataParallel(net().to(dev)), net().to(dev)
    log(f"\ntorch.nn.DataParallel here: device_ids={theirs.device_ids} ({gpus} GPUs), so it "
        + ("just calls the module." if gpus <= 1 else f"splits over {gpus} GPUs."))
    # Split over GPUs, each slice runs kernels picked for its own batch size: not bit for bit.
    log("  " + check("its output vs the plain module", max_diff(theirs(x.to(dev)), plain(
        x.to(dev))), 0.0 if gpus <= 1 else 1e-5))

    log(f"\nThreads and the GIL: forward + backward, 1 replica vs {replicas} in threads, "
        f"torch.get_num_threads() = {torch.get_num_threads()} per kernel; a thread that "
        f"wants the GIL may wait up to sys.getswitchinterval() = "
        f"{1e3 * sys.getswitchinterval():g} ms:")
    repeats = 3 if quick else 15
    for cls, n in ((Net, 256 if not quick else 64), (MLP, 8)):
        one, many = net(cls), DataParallel(net(cls), device_ids=devices)
        xb, yb = images[:n], labels[:n]
        forward = {"1 replica": lambda: one(xb), f"{replicas} threads": lambda: many(xb)}
        step = {"1 replica": lambda: F.nll_loss(one(xb), yb).backward(),
                f"{replicas} threads": lambda: F.nll_loss(many(xb), yb).backward()}
        for what, cands in (("forward", forward), ("forward+backward", step)):
            with torch.set_grad_enabled(what != "forward"):
                t = {k: summarize(v)["median"] for k, v in
                     time_alternating(cands, repeats=repeats, warmup=1).items()}
            a, b = t["1 replica"], t[f"{replicas} threads"]
            log(f"  {cls.__name__:4s} batch {n:3d} {what:17s}: {1e3 * a:7.2f} ms vs "
                f"{1e3 * b:7.2f} ms  -> speed-up {a / b:.2f}x")
    log("  (below 1x, the threads cost more than they save. Forward can gain where kernels are\n"
        "   big enough to run side by side without the GIL; backward runs in one thread on the\n"
        "   CPU whatever we do, and every replica's Python takes turns.)")


def main():
    parser = lesson_parser(__doc__)
    args = parser.parse_args()
    if args.world_size < 1:
        parser.error(f"--world-size (the number of replicas) must be >= 1, got {args.world_size}")
    args.dataset = get_dataset("auto").name
    # One process: DataParallel needs no group. launch() gives it a clean process with one
    # thread per kernel, so the only parallelism left is the replicas' threads.
    launch(run, 1, args, backend=args.backend)


if __name__ == "__main__":
    main()
