"""The learning rate of large-batch SGD, step by step: a gradual warmup, then a decay.

Goyal et al. 2017 train with k times the batch at k times the learning rate (the linear scaling
rule), but start at the small batch's rate and add a constant amount every iteration until
k x base_lr is reached: a large rate on a freshly initialised network blows it up. After the
warmup the rate decays, in steps (divided by 10 at milestones) or along a cosine.

In torch that is three schedulers chained (the optimizer's lr set to the peak, k x base_lr):

    warmup = LinearLR(opt, start_factor=1 / k, end_factor=1.0, total_iters=warmup_steps)
    decay = MultiStepLR(opt, milestones, gamma)  # or CosineAnnealingLR(opt, T_max, eta_min)
    SequentialLR(opt, [warmup, decay], milestones=[warmup_steps])

`lr_at(step, ...)` is the same rate in closed form, and `WarmupDecayLR` a scheduler of torch's
kind built on it (step(), get_last_lr(), state_dict()), equal to the chain above at every step
(tests/test_large_batch.py). The decay's clock starts when the warmup ends, as SequentialLR
restarts it: milestones and T_max count steps after the warmup. Lesson 18 and the benchmark use
torch's chain, as a user's code would; this file says in a few lines what the chain computes.
"""
import math

import torch

from dist_sgd.plumbing.mine import swap_in


def _check(warmup_steps, start_factor, decay, milestones, gamma, total_steps):
    """A ValueError naming the first setting that makes no schedule; nothing when all fit."""
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
        raise ValueError(f"warmup_steps must be an integer >= 0, got {warmup_steps!r}")
    if not 0 < start_factor <= 1:
        raise ValueError(f"start_factor must be in (0, 1] (LinearLR's rule), got {start_factor}")
    if decay not in ("none", "step", "cosine"):
        raise ValueError(f"decay must be 'none', 'step' or 'cosine', got {decay!r}")
    if decay == "step" and list(milestones) != sorted(milestones):
        raise ValueError(f"milestones must be increasing, got {list(milestones)}")
    if decay == "cosine" and (not isinstance(total_steps, int) or total_steps <= warmup_steps):
        raise ValueError(f"the cosine needs total_steps > warmup_steps ({warmup_steps}), "
                         f"got {total_steps!r}")


def lr_at(step, peak_lr, warmup_steps=0, start_factor=1.0, decay="none", milestones=(),
          gamma=0.1, total_steps=None, eta_min=0.0):
    """The learning rate of step `step` (0 = the first update).

    Warmup (step < warmup_steps): from start_factor x peak_lr up to peak_lr in equal steps
    (LinearLR: start_factor + (1 - start_factor) x step / warmup_steps, times peak_lr); Goyal's
    gradual warmup is start_factor = 1 / k. Then, with t = step - warmup_steps:
      "step":   peak_lr x gamma ** (number of milestones <= t)
      "cosine": eta_min + (peak_lr - eta_min) (1 + cos(pi t / T)) / 2, T = total_steps -
                warmup_steps (CosineAnnealingLR's T_max; past T it rises again, as torch's does)
      "none":   peak_lr
    warmup_steps = 0: no warmup, t = step from the start (never divide by warmup_steps then).
    """
    _check(warmup_steps, start_factor, decay, milestones, gamma, total_steps)
    # ---- exercise warmup_schedule: the rate at `step`: the warmup, then the decay's
    if step < warmup_steps:
        return peak_lr * (start_factor + (1 - start_factor) * step / warmup_steps)
    t = step - warmup_steps
    if decay == "step":
        return peak_lr * gamma ** sum(1 for m in milestones if m <= t)
    if decay == "cosine":
        period = total_steps - warmup_steps
        return eta_min + (peak_lr - eta_min) * (1 + math.cos(math.pi * t / period)) / 2
    return peak_lr
    # ---- end of exercise


class WarmupDecayLR(torch.optim.lr_scheduler.LRScheduler):
    """lr_at() as a scheduler: the optimizer's lr (each group's) is the peak; call step()
    after each optimizer.step(), as with torch's schedulers."""

    def __init__(self, optimizer, warmup_steps=0, start_factor=1.0, decay="none", milestones=(),
                 gamma=0.1, total_steps=None, eta_min=0.0, last_epoch=-1):
        _check(warmup_steps, start_factor, decay, milestones, gamma, total_steps)
        self.settings = dict(warmup_steps=warmup_steps, start_factor=start_factor, decay=decay,
                             milestones=tuple(milestones), gamma=gamma, total_steps=total_steps,
                             eta_min=eta_min)
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        return [lr_at(self.last_epoch, peak, **self.settings) for peak in self.base_lrs]


# DIST_SGD_MINE: a learner's version replaces this one
swap_in(globals(), "warmup_schedule", ("lr_at",), lesson="18")
