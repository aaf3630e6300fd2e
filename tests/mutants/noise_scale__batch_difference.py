"""Divides the difference of the squared norms by b_big - b_small instead of by
1 / b_small - 1 / b_big: the noise is over B, its difference is in 1 / B."""
CAUGHT_BY = "exact expectations at batch sizes 8 and 64 give back |G|^2 and tr(Sigma)"
HINT = "two equations, small_sq = g2 + tr / b_small"


def two_batch_estimates(small_sq, big_sq, b_small, b_big):
    g2 = (b_big * big_sq - b_small * small_sq) / (b_big - b_small)
    trace = (small_sq - big_sq) / (b_big - b_small)
    return g2, trace
