"""The drain (the backwards left after the last forward) in reversed order, last in, first
out as a stack: the gradients that arrive from the next stage come in the forwards' order.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""
CAUGHT_BY = "the order on every stage, step by step, m = 1, p and p + 3"
HINT = "backwards run in the forwards' order, first in, first out (the drain at the end too)"
PATCH = [("    return order + [(\"B\", i) for i in range(n_microbatches - warmup, n_microbatches)]\n",
          "    return order + [(\"B\", i) for i in reversed(range(n_microbatches - warmup, "
          "n_microbatches))]\n")]
