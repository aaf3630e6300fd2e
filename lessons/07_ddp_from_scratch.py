"""Lesson 07: DistributedDataParallel from scratch, in three steps.

Lesson 06 averaged the gradients *after* backward: while autograd computes, the network is
idle; while the gradients travel, the processor is idle. But backward produces gradients last
layer first, and the last layer's gradient is final long before the first layer's is computed.
DDP starts sending each gradient as soon as it is ready, so communication overlaps computation.
Three steps, each a small class you can diff (dist_sgd/ddp_steps.py, then dist_sgd/ddp.py):

  1. NaiveDDP: broadcast rank 0's weights at construction; average_gradients after backward.
  2. HookDDP: a hook on every parameter (register_post_accumulate_grad_hook) fires when
     autograd has accumulated that gradient and launches an *asynchronous* all-reduce of it;
     a callback queued on autograd's engine waits for them all before backward() returns.
     One message per parameter, and every rank must produce every gradient in the same order.
  3. DistributedDataParallel: the same hooks, but gradients are copied into buckets (~25 MiB,
     filled in reverse parameter order); a full bucket is all-reduced at once, buckets strictly
     in order, and at the end of backward any bucket still waiting for an unused parameter's
     gradient is sent anyway: fewer, larger messages, still overlapped, and no hang.

Every step is checked against one process computing the whole global batch, and step 3 also
against torch.nn.parallel.DistributedDataParallel (max differences printed). Dropout is off
(eval mode): with it on, every process draws its own masks and "equal" would mean nothing.
Then the lesson traces one backward pass of BigNet (figures/ddp_timeline.png) and sweeps the
bucket size, ours against torch's (figures/bucket_sweep.png).

Honest expectations on a 2-core laptop: overlap needs spare hardware. Here gloo's all-reduce
is itself CPU work (copies through the loopback network), so it competes with backward for
the same two cores and the overlap hides little; on GPUs with NCCL, the network and the GPU
work side by side and it hides most of the communication. The timeline shows both effects.

Run:
    python lessons/07_ddp_from_scratch.py --world-size 2
    python lessons/07_ddp_from_scratch.py --quick          # tiny; figures go to a temp folder
    torchrun --standalone --nproc-per-node 2 lessons/07_ddp_from_scratch.py

Exercises:
  1. Make step 2 hang: in HookDDP, let rank 1 skip fc2 in forward (an unused parameter). Why
     does step 3 not hang? Find the two lines of ddp.py that prevent it.
  2. Set bucket_cap_mb=0 (one bucket per parameter) and None (one bucket): how many all-reduces
     does the trace show, and where does the sweep put the best step time? Why is there a best?
  3. Use no_sync() for 3 micro-batches and check against one batch 3x larger (tests/test_ddp.py
     does it): how many all-reduces did the 3 backward passes launch?
  4. Pass all_reduce=dist_sgd.collectives.all_reduce: our ring, run on a helper thread. Compare
     the timeline with gloo's.
"""
import os
import sys
import tempfile

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from dist_sgd import collectives  # noqa: E402
from dist_sgd.bench import common, ddp as bench  # noqa: E402
from dist_sgd.data import get_dataset  # noqa: E402
from dist_sgd.ddp import DistributedDataParallel  # noqa: E402
from dist_sgd.ddp_steps import HookDDP, NaiveDDP  # noqa: E402
from dist_sgd.launch import launch, lesson_parser, log, rank_print  # noqa: E402
from dist_sgd.models import Net  # noqa: E402

RANK_BATCH, SMALL_CAP = 32, 0.01  # 0.01 MiB cuts Net's 87 KB of gradients into 3 buckets


def net(seed):
    torch.manual_seed(seed)
    return Net().eval()  # eval: dropout off (see the docstring)


def max_diff(model, reference):
    return max((p.grad - q.grad).abs().max().item()
               for p, q in zip(model.parameters(), reference.parameters()))


def check(what, model, reference):
    got = [p.grad for p in model.parameters()]
    torch.testing.assert_close(got, [q.grad for q in reference.parameters()])
    log(f"   {what}: max |gradient - one process's| = {max_diff(model, reference):.2e}")


def show_trace(trace, limit=14):
    t0 = trace[0]["t"]
    for e in trace[:limit]:
        what = e.get("param", e.get("bucket", ""))
        log(f"     {1e3 * (e['t'] - t0):7.2f} ms  {e['event']:12s} {what}")
    if limit is not None and len(trace) > limit:
        log(f"     ... {len(trace) - limit} more events")


def demo(rank, world_size, dataset_name, quick):
    images, labels = get_dataset(dataset_name, quiet=True).tensors
    # Equal shares: the mean of the ranks' mean losses is then the global batch's mean loss.
    x, y = images[:RANK_BATCH * world_size], labels[:RANK_BATCH * world_size]
    mine = slice(rank * RANK_BATCH, (rank + 1) * RANK_BATCH)
    reference = net(0)  # one process, the whole global batch, rank 0's starting weights
    F.nll_loss(reference(x), y).backward()

    def backward(model):
        F.nll_loss(model(x[mine]), y[mine]).backward()

    log("\n1. NaiveDDP: broadcast at construction, average_gradients after backward")
    model = net(seed=rank)  # every rank starts from different weights ...
    before = model.conv1.weight[0, 0, 0, 0].item()
    wrapped = NaiveDDP(model)  # ... and takes rank 0's
    rank_print(f"conv1.weight[0,0,0,0]: {before:+.5f} before wrapping, "
               f"{model.conv1.weight[0, 0, 0, 0].item():+.5f} after (rank 0's)")
    backward(wrapped)
    rank_print(f"after backward, |grad of fc2.weight| = {model.fc2.weight.grad.norm():.6f} (mine)")
    wrapped.finish_gradient_synchronization()
    rank_print(f"after average_gradients, |grad of fc2.weight| = "
               f"{model.fc2.weight.grad.norm():.6f} (everyone's)")
    check("NaiveDDP", model, reference)

    log("\n2. HookDDP: an asynchronous all-reduce per parameter, launched by its hook")
    model = net(seed=rank)
    wrapped = HookDDP(model)
    wrapped.trace = []
    backward(wrapped)  # no explicit sync: the engine callback waited before backward returned
    log("   rank 0's backward, in order (gradients arrive last layer first):")
    show_trace(wrapped.trace, limit=None)  # every event: the dones come last
    check("HookDDP", model, reference)

    log(f"\n3. DistributedDataParallel: buckets of bucket_cap_mb={SMALL_CAP} MiB")
    model = net(seed=rank)
    ddp = DistributedDataParallel(model, bucket_cap_mb=SMALL_CAP)
    for b in ddp.buckets:
        log(f"   bucket {b.index}: {b.nbytes / 1024:6.1f} KiB  {', '.join(b.names)}")
    ddp.trace = []
    backward(ddp)
    show_trace(ddp.trace, limit=20)
    check("our DDP", model, reference)
    theirs = net(seed=rank)
    backward(TorchDDP(theirs))
    torch.testing.assert_close([p.grad for p in model.parameters()],
                               [q.grad for q in theirs.parameters()])
    log(f"   our DDP vs torch DDP: max |difference| = {max_diff(model, theirs):.2e}")
    model = net(seed=rank)
    backward(DistributedDataParallel(model, bucket_cap_mb=SMALL_CAP,
                                     all_reduce=collectives.all_reduce))
    check("our DDP over our own ring all_reduce", model, reference)

    log("\nMeasuring on BigNet (1.2 M parameters): one traced backward pass"
        + ("" if quick else ", then the bucket sweep (a minute or two)") + " ...")
    s = bench.settings(quick)
    timeline = bench.timeline_rank(rank, world_size, s)
    sweep = None if quick else bench.sweep_rank(rank, world_size, s)
    return timeline, sweep


def main():
    args = lesson_parser(__doc__).parse_args()
    if args.quick and "DIST_SGD_FIGURES" not in os.environ:  # rough numbers: not for figures/
        common.FIGURES_DIR = tempfile.mkdtemp(prefix="dist_sgd_quick_figures_")
    dataset_name = get_dataset("auto").name
    timeline, sweep = launch(demo, args.world_size, dataset_name, args.quick,
                             backend=args.backend)[0] or (None, None)
    if timeline is None:
        return  # a torchrun rank other than 0: rank 0 writes the figures
    log("\nOne backward pass of BigNet (rank 0; ms since backward() was called):")
    bench.save_timeline(timeline)
    paths = [bench.draw_timeline()]
    if sweep is not None:
        log("\nBucket sweep (BigNet, median step time):")
        bench.save_sweep(sweep)
        paths.append(bench.draw_sweep())
    else:
        log("\n(--quick: no bucket sweep; run without --quick or `python -m dist_sgd.bench ddp`)")
    for path in paths:
        log(f"wrote {path}")


if __name__ == "__main__":
    main()
