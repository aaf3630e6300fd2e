"""Lesson 19: pipeline parallelism, the model's layers split into stages, one per rank.

Every lesson so far copied the whole model onto every rank and split the data. When the model
itself does not fit, split the model: stage s of p keeps a run of its layers. Forward, stage s
receives the activations from stage s - 1 (send/recv, lesson 02), runs its layers and sends its
output on; backward, the gradient of those activations travels back the same way. The loss
exists on the last stage only: there `step()` returns the outputs and fills `losses`; every
other stage gets None.

One batch through the stages (naive) keeps one stage busy at a time. Cut the batch into m
micro-batches and stage 0 starts the second while stage 1 runs the first:

  GPipe   all m forwards, then all m backwards: each stage holds m micro-batches' activations
  1F1B    stage s runs p - 1 - s forwards, then one forward one backward, then the rest backward:
          at most p micro-batches held (stage 0), the same idle time

Both leave each stage idle (p - 1) / (m + p - 1) of the step, the bubble: it fills and drains
once per step. More micro-batches shrink it; 1F1B keeps the memory from growing with m. The
gradients are the whole batch's: each micro-batch's mean loss, summed over micro-batches by
backward, divided by m once at the end (torch's scale_grads).

Our PipelineStage, ScheduleGPipe and Schedule1F1B take torch.distributed.pipelining's
arguments, so `train()` below runs both unchanged; on CPU with gloo torch's runs too.

The order is the idea: `gpipe(s, p, m)` and `one_f_one_b(s, p, m)` in
dist_sgd/parallel/pipeline.py are lists of ("F", i) and ("B", i). The lesson prints them, then
runs 1F1B's by hand in `run_order()` below, a plain loop over the list: forward receives the
activation, runs the stage and sends its output on; backward receives the output's gradient
and sends the input's gradient back. The library's schedules are that loop, plus checks and
metering (each step's trace, the activations held: dist_sgd/parallel/pipeline_meter.py). The
measured bubble and what it means on 2 cores: figures/README.md, "The pipeline's schedule".

Run:
    python lessons/19_pipeline.py                   # 2 stages
    python lessons/19_pipeline.py --world-size 4    # 4 stages on 2 cores: see the bubble
    python lessons/19_pipeline.py --quick
    python lessons/19_pipeline.py --save-figures    # also draws lesson19_schedule.png
    torchrun --standalone --nproc-per-node 2 lessons/19_pipeline.py

Exercises:
  1. Stage 0 of 1F1B holds p micro-batches at its peak, the last stage one. Why, and what
     would stage 0 have to wait for to hold fewer?
  2. The bubble at p = 2 for m = 1, 4, 8: what m brings it under 5%, and what does each
     micro-batch cost then (a message, a smaller matrix product)?
  3. Write 1F1B's order and the last stage's loss yourself, checked against one process:
     python3 -m dist_sgd.course start one_f_one_b
"""
import statistics

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed import pipelining as theirs

from dist_sgd.parallel import pipeline as ours
from dist_sgd.parallel.pipeline_meter import draw_trace
from dist_sgd.plumbing.check import check, max_diff
from dist_sgd.plumbing.figures import figure_path
from dist_sgd.plumbing.launch import launch, lesson_parser
from dist_sgd.plumbing.rank import device, log

STEPS, LR, M = 2, 0.1, 4  # M: micro-batches of the GPipe and 1F1B checks
SCHEDULES = {"naive": ("ScheduleGPipe", 1), "GPipe": ("ScheduleGPipe", M),
             "1F1B": ("Schedule1F1B", M), "1F1B by hand": ("Schedule1F1B", M)}


def make(width, layers, dtype=torch.float64):
    torch.manual_seed(0)  # the same model on every rank: each keeps its own stage of it
    blocks = [m for _ in range(layers) for m in (torch.nn.Linear(width, width), torch.nn.Tanh())]
    return torch.nn.Sequential(*blocks).to(device(), dtype)


def batch(step, n, width, dtype=torch.float64):
    g = torch.Generator().manual_seed(step)  # inputs and targets, the same on every rank
    return torch.randn(2, n, width, generator=g, dtype=dtype).to(device())


def recv(t, src):
    dist.recv(t, src)
    return t


def run_order(order, mod, xs, ys, rank, p):
    """One step of a stage by hand: `order`'s forwards and backwards, in its order."""
    inputs, outputs, sends = {}, {}, []
    for kind, i in order:
        if kind == "F":  # the activation from the previous stage (stage 0: its micro-batch)
            x = xs[i] if rank == 0 else recv(torch.empty_like(xs[i]), rank - 1)
            inputs[i] = x.requires_grad_()
            y = mod(x)
            # the last stage's loss: each micro-batch's mean, / m for the whole batch's
            outputs[i] = F.mse_loss(y, ys[i]) / len(xs) if rank == p - 1 else y
            if rank < p - 1:  # sent without waiting: the next stage may still be busy
                sends.append(dist.isend(y.detach(), rank + 1))
        else:  # the gradient of our output from the next stage (last stage: the loss's own)
            grad = None if rank == p - 1 else recv(torch.empty_like(outputs[i]), rank + 1)
            torch.autograd.backward(outputs.pop(i), grad)  # this micro-batch's graph freed
            if rank > 0:
                sends.append(dist.isend(inputs.pop(i).grad, rank - 1))
    for work in sends:  # every send done before the step ends
        work.wait()


def train(lib, schedule, m, rank, p, width, layers):
    """STEPS SGD steps with `lib`'s pipeline (ours, torch's; None: 1F1B run by run_order())."""
    mod = ours.split_stages(make(width, layers), p)[rank]
    if lib is not None:
        sched = getattr(lib, schedule)(lib.PipelineStage(mod, rank, p, device()), m, F.mse_loss)
    opt = torch.optim.SGD(mod.parameters(), lr=LR)
    for step in range(STEPS):
        x, y = batch(step, 8, width)
        opt.zero_grad()
        if lib is None:
            run_order(ours.one_f_one_b(rank, p, m), mod, x.chunk(m), y.chunk(m), rank, p)
        else:
            sched.step(*([x] if rank == 0 else []), **({"target": y} if rank == p - 1 else {}))
        opt.step()
    return mod


def checks(rank, p, width, layers):
    one = make(width, layers)  # one process, the whole batch (float64: no TF32 on a GPU)
    opt = torch.optim.SGD(one.parameters(), lr=LR)
    for step in range(STEPS):
        x, y = batch(step, 8, width)
        opt.zero_grad()
        F.mse_loss(one(x), y).backward()
        last = [q.grad.clone() for q in ours.split_stages(one, p)[rank].parameters()]
        opt.step()
    mine, out = ours.split_stages(one, p)[rank], {}
    for name, (schedule, m) in SCHEDULES.items():
        a = train(None if "by hand" in name else ours, schedule, m, rank, p, width, layers)
        b = train(theirs, schedule, m, rank, p, width, layers)
        out[f"{name} (m={m}): gradients at step {STEPS} vs one process"] = max_diff(
            [q.grad for q in a.parameters()], last)
        out[f"{name} (m={m}): weights after {STEPS} steps vs one process"] = max_diff(a, mine)
        out[f"{name} (m={m}): weights vs torch's pipelining"] = max_diff(a, b)
    return out


def timed(rank, p, schedule, m, width, steps):
    """Each step's trace of this stage, a bigger float32 model (2 layers per stage)."""
    mod = ours.split_stages(make(width, 2 * p, torch.float32), p)[rank]
    sched = getattr(ours, schedule)(ours.PipelineStage(mod, rank, p, device()), m, F.mse_loss)
    x, y = batch(0, width, width, torch.float32)  # micro-batches big enough to hide a message
    traces = []
    for _ in range(steps):
        sched.step(*([x] if rank == 0 else []), **({"target": y} if rank == p - 1 else {}))
        traces.append(sched.trace)
    return traces, (sched.peak_held, sched.peak_bytes)


def run(rank, world_size, args):
    p, width = world_size, 128 if args.quick else 1024
    out = {"checks": checks(rank, p, 8, 4 if p < 4 else p), "bubble": {}, "held": {}}
    for m in (1, 4, 8):
        out["bubble"][m] = timed(rank, p, "ScheduleGPipe", m, width, 4)[0][1:]  # 1st: warm-up
    for schedule in ("ScheduleGPipe", "Schedule1F1B"):
        traces, out["held"][schedule] = timed(rank, p, schedule, 8, width, 2)
        out[schedule] = traces[-1]
    return out


def idle(stages):
    """Each stage's idle share of the step: from the first start to the last end, anywhere."""
    end = max(e["end"] for t in stages for e in t)
    return [1 - sum(e["end"] - e["start"] for e in t) / end for t in stages]


def report(p, results):
    log(f"each stage's order, m = {M} (F: forward, B: backward, of micro-batch i):")
    for s in range(p):
        for name, order in (("GPipe", ours.gpipe), ("1F1B ", ours.one_f_one_b)):
            log(f"  stage {s} {name}: " + " ".join(f"{k}{i}" for k, i in order(s, p, M)))
    for name in results[0]["checks"]:
        log(check(name, max(r["checks"][name] for r in results), 1e-12))
    log(f"\nthe bubble, GPipe on {p} stages: each stage's idle share of a step, from its trace"
        + ("\n(ranks share 2 cores here: a waiting stage lends its core to another)" if p > 2
           else ""))
    for m, steps in results[0]["bubble"].items():
        shares = [statistics.median(idle(s)) for s in zip(*(r["bubble"][m] for r in results))]
        measured, formula = statistics.median(shares), (p - 1) / (m + p - 1)
        log(f"  m = {m}: measured {measured:.3f}, (p - 1) / (m + p - 1) = {formula:.3f}"
            + (f", ratio {measured / formula:.2f}" if formula else ""))
    log("activations held at the peak, m = 8 (micro-batches, KiB autograd saved):")
    for s, r in enumerate(results):
        (g, gb), (o, ob) = r["held"]["ScheduleGPipe"], r["held"]["Schedule1F1B"]
        log(f"  stage {s}: GPipe {g} ({gb / 1024:.0f} KiB)  1F1B {o} ({ob / 1024:.0f} KiB), "
            f"at most p = {p}: {o <= p}")


if __name__ == "__main__":
    args = lesson_parser(__doc__, save_figures=True).parse_args()
    results = launch(run, args.world_size, args, backend=args.backend)
    if results is not None:
        report(len(results), results)
        if args.save_figures:
            log(f"wrote {draw_trace(results, figure_path('lesson19_schedule.png'))}")
    log("\n" + __doc__[__doc__.index("Exercises:"):].rstrip())
