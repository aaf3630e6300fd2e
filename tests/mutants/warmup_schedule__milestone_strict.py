"""Counts a milestone once t has passed it, m < t, instead of from its own step, m <= t:
MultiStepLR multiplies by gamma at the milestone's epoch itself, so every drop comes one step
late.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""
CAUGHT_BY = "Goyal's warmup: 0.1 x 8 reached in 5 steps from 0.1, then divided by 10 twice"
HINT = "a milestone counts from its own step on"
PATCH = [("        return peak_lr * gamma ** sum(1 for m in milestones if m <= t)\n",
          "        return peak_lr * gamma ** sum(1 for m in milestones if m < t)\n")]
