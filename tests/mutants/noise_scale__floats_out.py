"""Returns Python floats, float(g2) and float(trace), as the scalars the lesson feeds it: right
for floats, but tensors of many pairs (one estimate per element) cannot become one float.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""
CAUGHT_BY = "unbiased on 4000 sampled batches of 4 and 32 (tensors in, tensors out)"
HINT = "tensors in, tensors out"
PATCH = [("    return g2, trace\n", "    return float(g2), float(trace)\n")]
