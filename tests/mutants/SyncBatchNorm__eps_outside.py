"""Adds eps after the root, 1 / sqrt(var) (+ eps nowhere, or outside): a constant channel then
divides by 0, and every invstd is off by the eps it should hold.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""
CAUGHT_BY = "global_moments on uneven local batches (3, 1, 4, 2 rows)"
HINT = "eps goes inside the root"
PATCH = [("    return mean, var, torch.rsqrt(var + eps), n\n",
          "    return mean, var, torch.rsqrt(var), n\n")]
