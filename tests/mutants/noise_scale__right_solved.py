"""A correct version: the 2 x 2 system solved by elimination, tr(Sigma) first."""


def two_batch_estimates(small_sq, big_sq, b_small, b_big):
    trace = (small_sq - big_sq) * b_small * b_big / (b_big - b_small)
    g2 = big_sq - trace / b_big
    return g2, trace
