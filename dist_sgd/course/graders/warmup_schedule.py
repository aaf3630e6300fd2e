"""Lesson 18's lr_at: the learning rate at every step, equal to torch's LinearLR warmup chained
by SequentialLR to MultiStepLR or CosineAnnealingLR (what the learner's code would run on)."""
import math

import torch
from torch.optim.lr_scheduler import (CosineAnnealingLR, LambdaLR, LinearLR, MultiStepLR,
                                      SequentialLR)

from dist_sgd.course.grade import Grader

ZERO = "warmup_steps = 0 means no warmup: the first step is already at peak_lr (divide by " \
       "warmup_steps only inside the warmup)"
grader = Grader("warmup_schedule", error_hints={"division by zero": ZERO})
REL = 1e-12
HINTS = {
    "start": "the warmup starts at start_factor x peak_lr (the small batch's rate), not at 0",
    "clock": "the decay's clock starts when the warmup ends: t = step - warmup_steps counts the "
             "milestones and the cosine's angle (SequentialLR restarts it)",
    "period": "the cosine's period is T = total_steps - warmup_steps, from the warmup's end to "
              "total_steps (torch's T_max inside SequentialLR), not the whole run",
    "strict": "a milestone counts from its own step on: gamma ** (number of milestones m with "
              "m <= t), not m < t",
    "clamp": "past T the cosine turns back up, as torch's does: no clamping of t at T",
    "eta_min": "the cosine ends at eta_min, not at 0: eta_min + (peak_lr - eta_min) * (1 + "
               "cos(pi t / T)) / 2",
    "rise": "the rate rises at every step of the warmup, reaching peak_lr exactly at step "
            "warmup_steps: start_factor + (1 - start_factor) * step / warmup_steps",
    "decay": "after the warmup, with t = step - warmup_steps, compare with lr_at's docstring: "
             "\"step\", \"cosine\" or \"none\" (the peak)",
}
WRONG = ("start", "clock", "period", "strict", "clamp", "eta_min")


def _torchs(peak, warmup, start, decay, steps, **kw):
    """torch's rate at each of `steps` steps, one parameter group at lr=peak."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=peak)
    after = (MultiStepLR(opt, kw["milestones"], kw["gamma"]) if decay == "step" else
             CosineAnnealingLR(opt, kw["total_steps"] - warmup, kw.get("eta_min", 0.0))
             if decay == "cosine" else LambdaLR(opt, lambda _: 1.0))
    chain = after if warmup == 0 else SequentialLR(
        opt, [LinearLR(opt, start, 1.0, total_iters=warmup), after], milestones=[warmup])
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        chain.step()
    return out


def _wrong(step, peak, warmup, start, decay, wrong, milestones=(), gamma=0.1, total_steps=None,
           eta_min=0.0):
    """The rate the wrong formula named by `wrong` (a key of HINTS) gives at `step`."""
    if step < warmup:
        return peak * (step / warmup if wrong == "start" else start + (1 - start) * step / warmup)
    t = step if wrong == "clock" else step - warmup
    if decay == "step":
        passed = [m < t if wrong == "strict" else m <= t for m in milestones]
        return peak * gamma ** sum(passed)
    if decay == "cosine":
        period = total_steps if wrong == "period" else total_steps - warmup
        t, low = min(t, period) if wrong == "clamp" else t, 0.0 if wrong == "eta_min" else eta_min
        return low + (peak - low) * (1 + math.cos(math.pi * t / period)) / 2
    return peak


def _close(a, b):
    return abs(a - b) <= REL * abs(b) + 1e-15


def _fitting(got, expected, step, args, kw):
    """The hints for the wrong formulas every one of the learner's rates fits; when none fits,
    the hint for where the first wrong step falls: the warmup's first step, a later one, or
    the decay."""
    found = []
    for wrong in WRONG:
        rates = [_wrong(s, *args, wrong, **kw) for s in range(len(got))]
        if not all(map(_close, rates, expected)) and all(map(_close, got, rates)):
            found.append(HINTS[wrong])
    warmup = args[1]
    return found or [HINTS["start" if step == 0 and warmup > 0 else "rise" if step < warmup
                           else "decay"]]


def _compare(ctx, peak, warmup, start, decay, steps, **kw):
    """lr_at at every step against torch's chain, the first wrong step failing with the hint
    its evidence supports."""
    expected, got = _torchs(peak, warmup, start, decay, steps, **kw), []
    for step in range(steps):
        rate = ctx.call(ctx.impl.lr_at, step, peak, warmup_steps=warmup, start_factor=start,
                        decay=decay, **kw)
        ctx.expect(isinstance(rate, (int, float)) or getattr(rate, "ndim", 1) == 0,
                   f"lr_at({step}) returned {type(rate).__name__}, expected a number")
        got.append(float(rate))
    for step, e in enumerate(expected):
        ctx.expect(_close(got[step], e),
                   f"{warmup}-step warmup, decay {decay!r}: step {step}: lr {got[step]:.10g}, "
                   f"expected {e:.10g} (torch's chain; "
                   f"tolerance {REL:.0e} x |expected|)",
                   _fitting(got, expected, step, (peak, warmup, start, decay), kw))


@grader.case("Goyal's warmup: 0.1 x 8 reached in 5 steps from 0.1, then divided by 10 twice")
def goyal(ctx):
    """Goyal's recipe: the rate at every step equal to torch's LinearLR + SequentialLR +
    MultiStepLR, rising from the small batch's rate each step, the decay timed from the warmup's
    end."""
    _compare(ctx, 0.8, 5, 1 / 8, "step", 16, milestones=(4, 8), gamma=0.1)


@grader.case("a 7-step warmup, then a cosine to eta_min and past T_max")
def cosine(ctx):
    """A warmup then a cosine: every step equal to torch's LinearLR + CosineAnnealingLR, also
    past T_max, where torch's cosine turns back up."""
    _compare(ctx, 0.6, 7, 1 / 3, "cosine", 40, total_steps=30, eta_min=0.001)


@grader.case("a one-step warmup and a milestone at the warmup's end")
def edges(ctx):
    """The edges: a warmup of one step, and a milestone falling exactly where the warmup ends."""
    _compare(ctx, 0.4, 1, 0.25, "step", 6, milestones=(0, 2), gamma=0.5)


@grader.case("no warmup (warmup_steps = 0): a cosine, then no decay at all")
def no_warmup(ctx):
    """warmup_steps = 0: the schedule starts at peak_lr, the cosine's clock at step 0 (equal to
    torch's CosineAnnealingLR alone); decay "none" keeps peak_lr at every step."""
    _compare(ctx, 0.5, 0, 0.1, "cosine", 12, total_steps=10, eta_min=0.01)
    _compare(ctx, 0.3, 0, 1.0, "none", 4)
    _compare(ctx, 0.3, 3, 0.5, "none", 6)
