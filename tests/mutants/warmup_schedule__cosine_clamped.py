"""Holds the rate at eta_min once t passes T (t = min(t, T)), as a schedule "should": the
contract follows torch's CosineAnnealingLR, whose cosine turns back up past T_max.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""
CAUGHT_BY = "a 7-step warmup, then a cosine to eta_min and past T_max"
HINT = "past T the cosine turns back up"
PATCH = [("        period = total_steps - warmup_steps\n",
          "        period = total_steps - warmup_steps\n        t = min(t, period)\n")]
