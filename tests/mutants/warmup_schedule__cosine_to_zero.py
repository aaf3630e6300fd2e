"""The cosine from peak_lr down to 0, leaving eta_min out: (peak_lr) (1 + cos(pi t / T)) / 2.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""
CAUGHT_BY = "a 7-step warmup, then a cosine to eta_min and past T_max"
HINT = "the cosine ends at eta_min, not at 0"
PATCH = [("        return eta_min + (peak_lr - eta_min) * (1 + math.cos(math.pi * t / period)) / 2\n",
          "        return peak_lr * (1 + math.cos(math.pi * t / period)) / 2\n")]
