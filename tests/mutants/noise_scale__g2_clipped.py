"""Clips |G|^2 at zero ("a squared norm cannot be negative"): right whenever the signal is
strong, but where |G|^2 is below tr(Sigma) / b_big about half the unbiased estimates are
negative, and clipping them biases the mean upward by some 20 standard errors.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""
CAUGHT_BY = "unbiased where one term is weak: |G|^2 below tr(Sigma) / b_big, then tr(Sigma) small"
HINT = "clipped at zero (or made positive)?"
PATCH = [("    return g2, trace\n", "    return g2 * (g2 > 0), trace\n")]
