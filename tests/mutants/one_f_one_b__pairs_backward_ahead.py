"""In the pairs the backward is numbered like the forward, ("F", warmup + i), ("B", warmup +
i): after the warm-up the stage runs the backward of the micro-batch it just sent forward,
skipping the ones it holds from the warm-up.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""
CAUGHT_BY = "the order on every stage, step by step, m = 1, p and p + 3"
HINT = "is next: backwards run in the forwards' order"
PATCH = [('        order += [("F", warmup + i), ("B", i)]\n',
          '        order += [("F", warmup + i), ("B", warmup + i)]\n')]
