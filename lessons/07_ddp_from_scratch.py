"""Lesson 07: DistributedDataParallel from scratch, in three steps.

Lesson 06 averaged the gradients *after* backward: while autograd computes, the network is
idle; while the gradients travel, the processor is idle. But backward produces gradients last
layer first, and the last layer's gradient is final long before the first layer's is computed.
DDP starts sending each gradient as soon as it is ready, so communication overlaps computation.
Three steps, each adding one idea to the one before (read dist_sgd/ddp_steps.py, then
dist_sgd/ddp.py, whose core class BucketedDDP comes before the extras):

  1. NaiveDDP: broadcast rank 0's weights at construction; average_gradients after backward.
  2. HookDDP: a hook on every parameter (register_post_accumulate_grad_hook) fires when
     autograd has accumulated that gradient and launches an *asynchronous* all-reduce of it;
     a callback queued on autograd's engine waits for them all before backward() returns.
     One message per parameter, and every rank must produce every gradient in the same order.
  3. DistributedDataParallel: the same hooks, but gradients are copied into buckets (~25 MiB,
     filled in reverse parameter order); a full bucket is all-reduced at once, buckets strictly
     in order, and at the end of backward any bucket still waiting for an unused parameter's
     gradient is sent anyway: fewer, larger messages, still overlapped, and no hang.

Every step is checked against one process computing the whole global batch and against
torch.nn.parallel.DistributedDataParallel (max differences printed). Dropout is off (eval
mode): with it on, every process draws its own masks and "equal" would mean nothing. Then the
lesson prints when each all-reduce started and ended during one backward pass, and times one
training step of each strategy side by side (alternating, medians).

Ours accepts torch's DDP arguments where it can and refuses the others by name, and runs
torch's communication hooks (register_comm_hook): the README's page "How ours differs from
torch's" lists what is not supported and what happens then.

Honest expectations on a 2-core laptop: overlap needs spare hardware. Here gloo's all-reduce
is itself CPU work (copies through the loopback network), so it competes with backward for
the same two cores and the overlap hides little; on GPUs with NCCL, the network and the GPU
work side by side and it hides most of the communication.

Run:
    python lessons/07_ddp_from_scratch.py --world-size 2
    python lessons/07_ddp_from_scratch.py --quick
    python lessons/07_ddp_from_scratch.py --save-figures   # also draws figures/lesson07_timeline.png
    torchrun --standalone --nproc-per-node 2 lessons/07_ddp_from_scratch.py

Exercises:
  1. Make step 2 hang: in HookDDP, let rank 1 skip fc2 in forward (an unused parameter). Why
     does step 3 not hang? Find the lines of ddp.py that prevent it.
  2. Set bucket_cap_mb=0 (one bucket per parameter) and None (one bucket): how many all-reduces
     does the trace show, and which step time is best? Why is there a best?
  3. Use no_sync() for 3 micro-batches and check against one batch 3x larger (tests/test_ddp.py
     does it): how many all-reduces did the 3 backward passes launch?
  4. Register torch's fp16_compress_hook (torch.distributed.algorithms.ddp_comm_hooks.
     default_hooks) on our DDP: how far do the gradients move from float32's?
"""
import os

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from dist_sgd.comm import collectives
from dist_sgd.plumbing.check import check, max_diff
from dist_sgd.sgd.data import get_dataset
from dist_sgd.ddp.ddp import DistributedDataParallel
from dist_sgd.ddp.steps import HookDDP, NaiveDDP
from dist_sgd.plumbing.launch import launch, lesson_parser
from dist_sgd.plumbing.rank import log, rank_print
from dist_sgd.sgd.models import BigNet, Net
from dist_sgd.plumbing.timing import time_alternating

RANK_BATCH, SMALL_CAP, TOL = 32, 0.01, 1e-6  # 0.01 MiB cuts Net's 87 KB into 3 buckets


def net(seed, cls=Net):
    torch.manual_seed(seed)
    return cls().eval()  # eval: dropout off (see the docstring)


def grads(model):
    return [p.grad for p in model.parameters()]


def show_trace(trace, limit):
    t0 = trace[0]["t"]
    for e in trace[:limit]:
        what = f"{e['event']:12s} {e.get('param', e.get('bucket', ''))}"
        log(f"     {1e3 * (e['t'] - t0):7.2f} ms  {what.rstrip()}")
    if len(trace) > limit:
        log(f"     ... {len(trace) - limit} more events")


def demo(rank, world_size, dataset_name, quick):
    images, labels = get_dataset(dataset_name, quiet=True).tensors
    # Equal shares: the mean of the ranks' mean losses is then the global batch's mean loss.
    x, y = images[:RANK_BATCH * world_size], labels[:RANK_BATCH * world_size]
    mine = slice(rank * RANK_BATCH, (rank + 1) * RANK_BATCH)

    def backward(model):
        F.nll_loss(model(x[mine]), y[mine]).backward()

    reference = net(0)  # one process, the whole global batch, rank 0's starting weights
    F.nll_loss(reference(x), y).backward()
    theirs = net(seed=rank)  # torch's DDP, from each rank's own weights like ours below
    backward(TorchDDP(theirs))

    def checks(what, model):
        log("   " + check(f"{what} vs one process", max_diff(grads(model), grads(reference)), TOL))
        log("   " + check(f"{what} vs torch DDP", max_diff(grads(model), grads(theirs)), TOL))

    log("\n1. NaiveDDP: broadcast at construction, average_gradients after backward")
    model = net(seed=rank)  # every rank starts from different weights ...
    before = model.conv1.weight[0, 0, 0, 0].item()
    wrapped = NaiveDDP(model)  # ... and takes rank 0's
    rank_print(f"conv1.weight[0,0,0,0]: {before:+.5f} before wrapping, "
               f"{model.conv1.weight[0, 0, 0, 0].item():+.5f} after (rank 0's)")
    backward(wrapped)
    rank_print(f"after backward, |grad of fc2.weight| = {model.fc2.weight.grad.norm():.6f} (mine)")
    wrapped.finish_gradient_synchronization()
    rank_print(f"after average_gradients: {model.fc2.weight.grad.norm():.6f} (everyone's)")
    checks("NaiveDDP", model)

    log("\n2. HookDDP: an asynchronous all-reduce per parameter, launched by its hook")
    model = net(seed=rank)
    wrapped = HookDDP(model)
    wrapped.trace = []
    backward(wrapped)  # no explicit sync: the engine callback waited before backward returned
    log("   rank 0's backward, in order (gradients arrive last layer first):")
    show_trace(wrapped.trace, limit=24)
    checks("HookDDP", model)

    log(f"\n3. DistributedDataParallel: buckets of bucket_cap_mb={SMALL_CAP} MiB")
    model = net(seed=rank)
    ddp = DistributedDataParallel(model, bucket_cap_mb=SMALL_CAP)
    for b in ddp.buckets:
        log(f"   bucket {b.index}: {b.nbytes / 1024:6.1f} KiB  {', '.join(b.names)}")
    ddp.trace = []
    backward(ddp)
    show_trace(ddp.trace, limit=30)
    checks("our DDP", model)
    model = net(seed=rank)
    backward(DistributedDataParallel(model, bucket_cap_mb=SMALL_CAP,
                                     all_reduce=collectives.all_reduce))
    checks("our DDP over our own ring all_reduce", model)

    big = BigNet if not quick else Net
    log(f"\nOne training step of {big.__name__}, each strategy in turn (medians, slowest rank):")
    steps = {}
    for name, wrap in {"average_gradients": lambda m: NaiveDDP(m, flat=True),
                       "per-parameter hooks": HookDDP,
                       "our DDP, 1 bucket": lambda m: DistributedDataParallel(m, None),
                       "our DDP, 25 MiB": DistributedDataParallel,
                       "our DDP, per parameter": lambda m: DistributedDataParallel(m, 0),
                       "torch DDP": TorchDDP}.items():
        model = net(seed=rank, cls=big)
        wrapped, opt = wrap(model), torch.optim.SGD(model.parameters(), lr=0.01)

        def step(wrapped=wrapped, opt=opt):
            opt.zero_grad()
            backward(wrapped)
            if hasattr(wrapped, "finish_gradient_synchronization"):
                wrapped.finish_gradient_synchronization()  # NaiveDDP's whole work
            opt.step()
        steps[name] = step
    times = time_alternating(steps, repeats=3 if quick else 15, warmup=1)
    base = sorted(times["torch DDP"])[len(times["torch DDP"]) // 2]
    for name, samples in times.items():
        median = sorted(samples)[len(samples) // 2]
        log(f"   {name:24s} {1e3 * median:8.2f} ms   {median / base:5.2f}x torch DDP's")
    torch.distributed.barrier()  # no rank tears down while a peer's torch DDP still finishes
    return ddp.trace


def draw_timeline(trace, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    t0 = trace[0]["t"]
    fig, ax = plt.subplots(figsize=(8, 3))
    hooks = [1e3 * (e["t"] - t0) for e in trace if e["event"] == "hook"]
    ax.plot(hooks, [-1] * len(hooks), "k|", markersize=12, label="gradient ready (hook)")
    start = {e["bucket"]: e["t"] for e in trace if e["event"] == "launch"}
    for e in trace:
        if e["event"] == "done":
            ax.plot([1e3 * (start[e["bucket"]] - t0), 1e3 * (e["t"] - t0)], [e["bucket"]] * 2,
                    lw=6, color="tab:blue", label="bucket all-reduce" if e["bucket"] == 0 else None)
    ax.set_yticks(range(-1, len(start)), ["gradients ready"] + [f"bucket {b}" for b in start])
    ax.set(xlabel="ms since the first gradient", title="Our DDP, rank 0: one backward pass of Net")
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    return path


def main():
    parser = lesson_parser(__doc__)
    parser.add_argument("--save-figures", action="store_true",
                        help="draw figures/lesson07_timeline.png (otherwise nothing is written)")
    args = parser.parse_args()
    dataset_name = get_dataset("auto").name
    results = launch(demo, args.world_size, dataset_name, args.quick, backend=args.backend)
    if results is not None and args.save_figures:
        figures = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "figures")
        os.makedirs(figures, exist_ok=True)
        log(f"\nwrote {draw_timeline(results[0], os.path.join(figures, 'lesson07_timeline.png'))}")


if __name__ == "__main__":
    main()
