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

Honest expectations: at p = 2 each rank has a core of its own. On a quiet 2-core machine m = 1
measures the formula (0.51 against 0.50), but m = 4 and 8 measure 1.4 and 2.2 times it (0.29
and 0.25 against 0.20 and 0.11): the formula counts compute alone, and every micro-batch adds
a message each way that a stage waits for, so the measured idle share shrinks more slowly than
(p - 1) / (m + p - 1) as m grows. At p = 3-4 ranks share 2 cores: a waiting stage
frees its core for another, so compute stretches and the idle share comes out off the
formula. On a busy machine every wait for a message also costs a wake-up by the scheduler
(milliseconds when the cores are taken): the more micro-batches, the more waits, and the
measured bubble grows with m where the formula shrinks.

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
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed import pipelining as theirs

from dist_sgd.parallel import pipeline as ours
from dist_sgd.parallel.pipeline import split_stages
from dist_sgd.plumbing.check import check, max_diff
from dist_sgd.plumbing.figures import figure_path
from dist_sgd.plumbing.launch import launch, lesson_parser
from dist_sgd.plumbing.rank import log, rank_print

STEPS, LR = 2, 0.1
SCHEDULES = {"naive": ("ScheduleGPipe", 1), "GPipe": ("ScheduleGPipe", 4),
             "1F1B": ("Schedule1F1B", 4)}


def make(width, layers, dtype=torch.float64):
    torch.manual_seed(0)  # the same model on every rank: each keeps its own stage of it
    return nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(width, width),
                                                              nn.Tanh())]).to(dtype)


def batch(step, n, width, dtype=torch.float64):
    g = torch.Generator().manual_seed(step)
    return torch.randn(n, width, generator=g, dtype=dtype), torch.randn(n, width, generator=g,
                                                                        dtype=dtype)


def train(lib, schedule, m, rank, p, width, layers, say=False):
    """STEPS SGD steps with `lib`'s pipeline (ours or torch's: the same code runs both)."""
    mod = split_stages(make(width, layers), p)[rank]
    stage = lib.PipelineStage(mod, rank, p, torch.device("cpu"))
    sched = getattr(lib, schedule)(stage, m, loss_fn=F.mse_loss)
    opt = torch.optim.SGD(mod.parameters(), lr=LR)
    for step in range(STEPS):
        x, y = batch(step, 8, width)
        opt.zero_grad()
        losses = []
        out = sched.step(*([x] if rank == 0 else []), **({"target": y, "losses": losses}
                                                          if rank == p - 1 else {}))
        opt.step()
    if say and rank == p - 1:
        rank_print(f"last stage: loss {torch.stack(losses).mean():.4f}, the mean of its {m} "
                   f"micro-batches' losses; step() returned the outputs {tuple(out.shape)}")
    elif say:
        rank_print(f"stage {rank}: step() returned {out}, losses stays {losses}: "
                   "the loss lives on the last stage")
    return mod


def checks(rank, p, width, layers):
    one = make(width, layers)  # one process, the whole batch
    opt = torch.optim.SGD(one.parameters(), lr=LR)
    for step in range(STEPS):
        x, y = batch(step, 8, width)
        opt.zero_grad()
        F.mse_loss(one(x), y).backward()
        last = [q.grad.clone() for q in split_stages(one, p)[rank].parameters()]
        opt.step()
    mine, out = split_stages(one, p)[rank], {}
    for name, (schedule, m) in SCHEDULES.items():
        a = train(ours, schedule, m, rank, p, width, layers, say=name == "GPipe")
        b = train(theirs, schedule, m, rank, p, width, layers)
        out[f"{name} (m={m}): gradients at step {STEPS} vs one process"] = max_diff(
            [q.grad for q in a.parameters()], last)
        out[f"{name} (m={m}): weights after {STEPS} steps vs one process"] = max_diff(a, mine)
        out[f"{name} (m={m}): weights vs torch's pipelining"] = max_diff(a, b)
    return out


def timed(rank, p, schedule, m, width, steps):
    """Each step's trace of this stage, a bigger float32 model (2 layers per stage)."""
    mod = split_stages(make(width, 2 * p, torch.float32), p)[rank]
    sched = getattr(ours, schedule)(ours.PipelineStage(mod, rank, p, "cpu"), m, F.mse_loss)
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


def draw(results, path):
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, 1, figsize=(9, 1.2 + 0.6 * len(results)), sharex=True)
    for ax, schedule in zip(axes, ("ScheduleGPipe", "Schedule1F1B")):
        for r in results:
            for e in r[schedule]:
                colour = "tab:blue" if e["kind"] == "forward" else "tab:orange"
                ax.broken_barh([(e["start"] * 1e3, (e["end"] - e["start"]) * 1e3)],
                               (e["stage"] - 0.4, 0.8), color=colour)
                ax.text((e["start"] + e["end"]) * 500, e["stage"], str(e["mb"]), ha="center",
                        va="center", fontsize=7)
        ax.set_ylabel("stage"), ax.invert_yaxis()
        ax.set_title(f"{schedule[8:]}, m = 8: forward (blue), backward (orange)", fontsize=9)
    axes[-1].set_xlabel("ms from the step's start")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def report(p, results):
    for name in results[0]["checks"]:
        log(check(name, max(r["checks"][name] for r in results), 1e-12))
    log(f"\nthe bubble, GPipe on {p} stages: each stage's idle share of a step, from its trace")
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


def main():
    args = lesson_parser(__doc__, save_figures=True).parse_args()
    results = launch(run, args.world_size, args, backend=args.backend)
    if results is not None:
        report(len(results), results)
        if len(results) > 2:
            log("(ranks share 2 cores here: a waiting stage lends its core to another)")
        if args.save_figures:
            log(f"wrote {draw(results, figure_path('lesson19_schedule.png'))}")
    log("\n" + __doc__[__doc__.index("Exercises:"):].rstrip())


if __name__ == "__main__":
    main()
