"""Lesson 07: DistributedDataParallel from scratch, in three steps.

Lesson 06 averaged the gradients *after* backward: while autograd computes, the network is
idle; while the gradients travel, the processor is idle. But backward produces gradients last
layer first, and the last layer's gradient is final long before the first layer's is computed.
DDP starts sending each gradient as soon as it is ready, so communication overlaps computation.
Three steps, each adding one idea (read dist_sgd/ddp/steps.py, then dist_sgd/ddp/bucketed.py):

  1. NaiveDDP: broadcast rank 0's weights at construction; average_gradients after backward.
  2. HookDDP: a hook on every parameter (register_post_accumulate_grad_hook) fires when
     autograd has accumulated that gradient and launches an *asynchronous* all-reduce of it;
     a callback queued on autograd's engine waits for them all before backward() returns.
     One message per parameter, and every rank must produce every gradient in the same order.
  3. BucketedDDP: the same hooks, but gradients are copied into buckets and a full bucket is
     all-reduced at once, buckets strictly in order; at the end of backward a bucket still
     waiting for an unused parameter is sent anyway: fewer, larger messages, still overlapped,
     and no hang. Its buckets follow torch's rules: the first backward runs with one bucket
     (nobody knows the order gradients arrive in yet), then the buckets are rebuilt in the
     order rank 0 saw the gradients arrive, so each bucket fills in one stretch of backward.

Every step is checked against one process computing the whole global batch; step 3 also
against torch.nn.parallel.DistributedDataParallel with the same buckets, bit for bit: equal
buckets in equal order make gloo add the same numbers in the same order. Dropout is off (eval
mode): with it on, every process draws its own masks and "equal" would mean nothing. The
lesson prints when each all-reduce started and ended during one backward pass.
dist_sgd.ddp.ddp.DistributedDataParallel is torch's interface (comm hooks, no_sync, buffers,
torch's arguments) around this same BucketedDDP.

Honest expectations on a 2-core laptop: overlap needs spare hardware. Here gloo's all-reduce
is itself CPU work (copies through the loopback network), so it competes with backward for
the same two cores and the overlap hides little; on GPUs with NCCL, the network and the GPU
work side by side and it hides most of the communication. The step times of every strategy,
side by side, are the benchmark's: `python -m dist_sgd.bench ddp` (figures/ddp_speed.png).

Run:
    python lessons/07_ddp_from_scratch.py --world-size 2
    python lessons/07_ddp_from_scratch.py --quick
    python lessons/07_ddp_from_scratch.py --save-figures   # also draws lesson07_timeline.png
    torchrun --standalone --nproc-per-node 2 lessons/07_ddp_from_scratch.py

Exercises:
  1. Make step 2 hang: in HookDDP, let rank 1 skip fc2 in forward (an unused parameter). Why
     does step 3 not hang? Find the lines of bucketed.py that prevent it.
  2. Set BUCKET_MB = 0 (one bucket per parameter) and 1024 (one bucket): how many all-reduces
     does the trace show, and when does the first start?
  3. Comment out the rebuild in BucketedDDP.finish_gradient_synchronization: which check
     fails at --world-size 3, and why not at 2? (Hint: x / 2 and x / 4 are exact.)
  4. Write step 2's hook yourself: `python3 -m dist_sgd.course start hook_ddp`, then
     `python3 -m dist_sgd.course check hook_ddp` grades it against torch's DDP.
  5. Write step 3's launch of the buckets: `python3 -m dist_sgd.course start bucketed_ddp`.
"""
import time

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from dist_sgd.comm import collectives
from dist_sgd.comm.ordered import start_all_reduce
from dist_sgd.ddp.bucketed import BucketedDDP
from dist_sgd.ddp.steps import HookDDP, NaiveDDP
from dist_sgd.plumbing.check import check, exact_float32, max_diff
from dist_sgd.plumbing.figures import figure_path
from dist_sgd.plumbing.launch import launch, lesson_parser
from dist_sgd.plumbing.rank import device, log, rank_print
from dist_sgd.sgd.data import get_dataset
from dist_sgd.sgd.models import Net

RANK_BATCH, BUCKET_MB, TOL = 32, 0.01, 1e-6  # 0.01 MiB cuts Net's 87 KB into 3 buckets


def net(seed):
    torch.manual_seed(seed)
    return Net().eval().to(device())  # eval: dropout off (see the docstring)


def grads(model):
    return [p.grad for p in model.parameters()]


def show_trace(trace, limit):
    t0 = trace[0][1]
    for event, t, what in trace[:limit]:
        log(f"     {1e3 * (t - t0):7.2f} ms  {event:12s} {what}".rstrip())
    if len(trace) > limit:
        log(f"     ... {len(trace) - limit} more events")


def run(rank, world_size, args):
    exact_float32(deterministic=True)  # a GPU: no TF32 (lesson 09), same bits for "bit for bit"
    images, labels = get_dataset(args.dataset, quiet=True).tensors
    # Equal shares: the mean of the ranks' mean losses is then the global batch's mean loss.
    n = RANK_BATCH * world_size
    x, y = images[:n].to(device()), labels[:n].to(device())
    mine = slice(rank * RANK_BATCH, (rank + 1) * RANK_BATCH)

    def backward(model, steps=1):  # the same batch each step; the last step's gradients stay
        for _ in range(steps):
            model.zero_grad()
            F.nll_loss(model(x[mine]), y[mine]).backward()

    reference = net(0)  # one process, the whole global batch, rank 0's starting weights
    F.nll_loss(reference(x), y).backward()
    theirs = net(seed=rank)  # torch's DDP, from each rank's own weights like ours below
    backward(TorchDDP(theirs, bucket_cap_mb=BUCKET_MB), steps=2)  # step 2: rebuilt buckets

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
    log("   " + check("NaiveDDP vs one process", max_diff(grads(model), grads(reference)), TOL))
    log("   " + check("NaiveDDP vs torch DDP", max_diff(grads(model), grads(theirs)), TOL))

    log("\n2. HookDDP: an asynchronous all-reduce per parameter, launched by its hook")
    model = net(seed=rank)
    wrapped = HookDDP(model)
    wrapped.trace = []
    backward(wrapped)  # no explicit sync: the engine callback waited before backward returned
    log("   rank 0's backward, in order (gradients arrive last layer first):")
    show_trace([(e["event"], e["t"], e["param"]) for e in wrapped.trace], limit=24)
    log("   " + check("HookDDP vs one process", max_diff(grads(model), grads(reference)), TOL))
    log("   " + check("HookDDP vs torch DDP", max_diff(grads(model), grads(theirs)), TOL))

    log(f"\n3. BucketedDDP, bucket_cap_mb={BUCKET_MB} (torch's rules)")
    model, trace = net(seed=rank), []
    ddp = BucketedDDP(model, bucket_cap_mb=BUCKET_MB,  # on_event: the core's trace point
                      on_event=lambda event, **f: trace.append((event, time.perf_counter(), f)))
    for step in range(2):
        log(f"   backward {step + 1}, with the buckets:")
        for b in ddp.buckets:
            kib = b.flat.numel() * b.flat.element_size() / 1024
            log(f"     bucket {b.index}: {kib:6.1f} KiB  {', '.join(b.names)}")
        trace.clear()
        backward(ddp)
    log("   the second backward, in order:")
    show_trace([(e, t, f.get("param", f.get("bucket", ""))) for e, t, f in trace], limit=30)
    log("   " + check("BucketedDDP vs one process", max_diff(grads(model), grads(reference)), TOL))
    log("   " + check("BucketedDDP vs torch DDP, the same buckets, bit for bit",
                      max_diff(grads(model), grads(theirs)), 0))

    # The core's other extension point: `reduce` replaces its all_reduce; here our own ring
    # (lesson 04) on a helper thread. With a reduce the core copies gradients unscaled.
    model = net(seed=rank)
    backward(BucketedDDP(model, BUCKET_MB, reduce=lambda b: start_all_reduce(
        b.flat.div_(world_size), collectives.all_reduce)), steps=2)
    log("   " + check("BucketedDDP over our ring vs one process",
                      max_diff(grads(model), grads(reference)), TOL))
    log("   " + check("BucketedDDP over our ring vs torch DDP",
                      max_diff(grads(model), grads(theirs)), TOL))
    torch.distributed.barrier()  # no rank tears down while a peer's torch DDP still finishes
    return trace


def draw_timeline(trace, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    t0 = trace[0][1]
    fig, ax = plt.subplots(figsize=(8, 3))
    hooks = [1e3 * (t - t0) for e, t, _ in trace if e == "hook"]
    ax.plot(hooks, [-1] * len(hooks), "k|", markersize=12, label="gradient ready (hook)")
    start = {f["bucket"]: t for e, t, f in trace if e == "launch"}
    for e, t, f in trace:
        if e == "done":
            ax.plot([1e3 * (start[f["bucket"]] - t0), 1e3 * (t - t0)], [f["bucket"]] * 2, lw=6,
                    color="tab:blue", label="bucket all-reduce" if f["bucket"] == 0 else None)
    ax.set_yticks(range(-1, len(start)), ["gradients ready"] + [f"bucket {b}" for b in start])
    ax.set(xlabel="ms since the first gradient", title="BucketedDDP, rank 0: a backward of Net")
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    return path


if __name__ == "__main__":
    args = lesson_parser(__doc__, save_figures=True).parse_args()
    args.dataset = get_dataset("auto").name  # chosen once, here: every rank reads the same
    results = launch(run, args.world_size, args, backend=args.backend)
    if results is not None and args.save_figures:
        log(f"\nwrote {draw_timeline(results[0], figure_path('lesson07_timeline.png'))}")
