"""Takes the big batch's squared norm as |G|^2: one batch size, so the noise tr(Sigma) / b_big
is still in it (the estimate of B_simple then comes out too small)."""
CAUGHT_BY = "exact expectations at batch sizes 8 and 64 give back |G|^2 and tr(Sigma)"
HINT = "the big batch's squared norm alone still holds"


def two_batch_estimates(small_sq, big_sq, b_small, b_big):
    g2 = big_sq
    trace = (small_sq - big_sq) / (1 / b_small - 1 / b_big)
    return g2, trace
