"""Clips tr(Sigma) at zero (a trace of a covariance is never negative): right where the noise
is strong, biased where tr(Sigma) / b_small is small next to the fluctuations of the squared
norms, and small_sq - big_sq comes out negative almost half the time.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""
CAUGHT_BY = "unbiased where one term is weak: |G|^2 below tr(Sigma) / b_big, then tr(Sigma) small"
HINT = "clipped at zero (or made positive)?"
PATCH = [("    return g2, trace\n", "    return g2, trace * (trace > 0)\n")]
