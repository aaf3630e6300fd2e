"""Computes the warmup's fraction step / warmup_steps before asking whether there is a warmup:
right whenever warmup_steps > 0, a ZeroDivisionError for a schedule with no warmup.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""
CAUGHT_BY = "no warmup (warmup_steps = 0): a cosine, then no decay at all"
HINT = "warmup_steps = 0 means no warmup"
PATCH = [("    if step < warmup_steps:\n        return peak_lr * (start_factor + (1 - start_factor) "
          "* step / warmup_steps)\n",
          "    rise = start_factor + (1 - start_factor) * step / warmup_steps\n"
          "    if step < warmup_steps:\n        return peak_lr * rise\n")]
