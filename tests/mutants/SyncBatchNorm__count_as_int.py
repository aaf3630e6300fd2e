"""Returns the count as a Python int, int(n): the statistics are right, but forward saves the
count for backward (save_for_backward takes tensors only) and hands it to global_means.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""
CAUGHT_BY = "global_moments on uneven local batches (3, 1, 4, 2 rows)"
HINT = "count is a tensor of one element in x's dtype"
PATCH = [("    return mean, var, torch.rsqrt(var + eps), n\n",
          "    return mean, var, torch.rsqrt(var + eps), int(n)\n")]
