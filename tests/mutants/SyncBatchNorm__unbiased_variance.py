"""Divides the sum of squared deviations by n - 1, the unbiased variance (torch.var's default):
BatchNorm normalizes with the biased one and keeps the unbiased one only for running_var.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""
CAUGHT_BY = "global_moments on uneven local batches (3, 1, 4, 2 rows)"
HINT = "this is the unbiased variance (divided by n - 1)"
PATCH = [("    var = (stats[c:2 * c] / n - mean * mean).clamp_(min=0)\n",
          "    var = ((stats[c:2 * c] - n * mean * mean) / (n - 1)).clamp_(min=0)\n")]
