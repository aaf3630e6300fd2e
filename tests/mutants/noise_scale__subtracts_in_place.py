"""Subtracts in place, small_sq -= big_sq, after |G|^2 is computed: the estimates are right,
but with tensors the caller's small_sq now holds the difference (with floats -= rebinds the
name, so only tensors show it).

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""
CAUGHT_BY = "unbiased on 4000 sampled batches of 4 and 32 (tensors in, tensors out)"
HINT = "tensors in stay as they are"
PATCH = [("    trace = (small_sq - big_sq) / (1 / b_small - 1 / b_big)\n",
          "    small_sq -= big_sq\n    trace = small_sq / (1 / b_small - 1 / b_big)\n")]
