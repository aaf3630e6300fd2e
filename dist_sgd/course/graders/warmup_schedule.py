"""Lesson 18's lr_at: the learning rate at every step, equal to torch's LinearLR warmup chained
by SequentialLR to MultiStepLR or CosineAnnealingLR (what the learner's code would run on)."""
import torch
from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, MultiStepLR, SequentialLR

from dist_sgd.course.grade import Grader

grader = Grader("warmup_schedule")
REL = 1e-12
HINTS = {
    "start": "the warmup starts at start_factor x peak_lr (the small batch's rate), not at 0",
    "clock": "the decay's clock starts when the warmup ends: t = step - warmup_steps counts the "
             "milestones and the cosine's angle (SequentialLR restarts it)",
    "rise": "the rate rises at every step of the warmup, reaching peak_lr exactly at step "
            "warmup_steps: start_factor + (1 - start_factor) * step / warmup_steps",
}


def _torchs(peak, warmup, start, decay, steps, **kw):
    """torch's rate at each of `steps` steps, one parameter group at lr=peak."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=peak)
    after = (MultiStepLR(opt, kw["milestones"], kw["gamma"]) if decay == "step" else
             CosineAnnealingLR(opt, kw["total_steps"] - warmup, kw.get("eta_min", 0.0)))
    chain = SequentialLR(opt, [LinearLR(opt, start, 1.0, total_iters=warmup), after],
                         milestones=[warmup])
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        chain.step()
    return out


def _fitting(hints, step, warmup):
    """The hint for where the first wrong step falls: the warmup's first step (its start),
    a later one of the warmup (its rise), or the decay after it (its clock)."""
    where = "start" if step == 0 and warmup > 0 else "rise" if step < warmup else "clock"
    return [h for h in hints if h == HINTS[where]]


def _compare(ctx, peak, warmup, start, decay, steps, hints, **kw):
    expected = _torchs(peak, warmup, start, decay, steps, **kw)
    for step, e in enumerate(expected):
        got = ctx.call(ctx.impl.lr_at, step, peak, warmup_steps=warmup, start_factor=start,
                       decay=decay, **kw)
        ctx.expect(isinstance(got, (int, float)) or getattr(got, "ndim", 1) == 0,
                   f"lr_at({step}) returned {type(got).__name__}, expected a number")
        ctx.expect(abs(float(got) - e) <= REL * abs(e) + 1e-15,
                   f"step {step}: lr {float(got):.10g}, expected {e:.10g} (torch's chain; "
                   f"tolerance {REL:.0e} x |expected|)", _fitting(hints, step, warmup))


@grader.case("Goyal's warmup: 0.1 x 8 reached in 5 steps from 0.1, then divided by 10 twice")
def goyal(ctx):
    """Goyal's recipe: the rate at every step equal to torch's LinearLR + SequentialLR +
    MultiStepLR, rising from the small batch's rate each step, the decay timed from the warmup's
    end."""
    _compare(ctx, 0.8, 5, 1 / 8, "step", 16, [HINTS["start"], HINTS["rise"], HINTS["clock"]],
             milestones=(4, 8), gamma=0.1)


@grader.case("a 7-step warmup, then a cosine to eta_min and past T_max")
def cosine(ctx):
    """A warmup then a cosine: every step equal to torch's LinearLR + CosineAnnealingLR, also
    past T_max, where torch's cosine turns back up."""
    _compare(ctx, 0.6, 7, 1 / 3, "cosine", 40, [HINTS["start"], HINTS["clock"]],
             total_steps=30, eta_min=0.001)


@grader.case("a one-step warmup and a milestone at the warmup's end")
def edges(ctx):
    """The edges: a warmup of one step, and a milestone falling exactly where the warmup ends."""
    _compare(ctx, 0.4, 1, 0.25, "step", 6, [HINTS["clock"], HINTS["rise"]],
             milestones=(0, 2), gamma=0.5)
