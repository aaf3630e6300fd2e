"""A correct version written another way: the warmup as an interpolation, the milestones
counted with a loop, the cosine from its half-angle identity."""
import math


def lr_at(step, peak_lr, warmup_steps=0, start_factor=1.0, decay="none", milestones=(),
          gamma=0.1, total_steps=None, eta_min=0.0):
    if step < warmup_steps:
        frac = step / warmup_steps
        return start_factor * peak_lr * (1 - frac) + peak_lr * frac
    t = step - warmup_steps
    if decay == "step":
        lr = peak_lr
        for m in milestones:
            if t >= m:
                lr *= gamma
        return lr
    if decay == "cosine":
        half = math.cos(math.pi * t / (total_steps - warmup_steps) / 2) ** 2
        return eta_min + (peak_lr - eta_min) * half
    return peak_lr
