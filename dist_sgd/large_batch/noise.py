"""The gradient noise scale B_simple = tr(Sigma) / |G|^2, measured for free by data parallelism.

G is the true gradient (over the whole data set) and Sigma the covariance of one example's
gradient. A batch of B examples averages B of them, so its gradient G_B has

    E |G_B|^2 = |G|^2 + tr(Sigma) / B.

B_simple (McCandlish et al. 2018) is the batch at which the noise term equals the signal: far
below it, doubling the batch halves the noise and nearly halves the steps needed; far above,
the gradient is already nearly exact and a bigger batch only costs more examples. Their
critical batch size B_crit, measured from steps and examples to a target, comes out close to it.

One batch size cannot separate the two terms; two can (their Appendix A). With |G_small|^2 and
|G_big|^2 the squared norms of gradients averaged over B_small and B_big examples:

    |G|^2     ~  (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)
    tr(Sigma) ~  (|G_small|^2 - |G_big|^2) / (1 / B_small - 1 / B_big)

Why moving averages, and where both batch sizes come for free: NoiseScale's docstring.
"""
from dist_sgd.plumbing.mine import swap_in


def two_batch_estimates(small_sq, big_sq, b_small, b_big):
    """(|G|^2, tr(Sigma)), unbiased, from squared gradient norms at batch sizes b_small <
    b_big.

    small_sq and big_sq: floats, or tensors of the same shape (one pair per element): the
    result is of the same kind, computed element by element, the caller's tensors left as they
    are. Neither estimate is clipped: where a term is small next to the noise its unbiased
    estimate comes out negative about as often as not (NoiseScale averages them).
    """
    if not 0 < b_small < b_big:
        raise ValueError(f"need 0 < b_small < b_big, got b_small={b_small}, b_big={b_big}: "
                         "with one batch size the signal and the noise cannot be told apart")
    # ---- exercise noise_scale: the two unbiased estimates from two batch sizes
    g2 = (b_big * big_sq - b_small * small_sq) / (b_big - b_small)
    trace = (small_sq - big_sq) / (1 / b_small - 1 / b_big)
    return g2, trace
    # ---- end of exercise


class NoiseScale:
    """B_simple over training: update() with each step's two squared norms; moving averages
    (weight `decay` on the past) of |G|^2 and tr(Sigma), then their ratio.

    Both are unbiased, but each is noisy (the first can come out negative): keep a moving average
    of each and divide the averages, never average the ratios. In data-parallel training each rank
    has its local gradient (B_small = the per-rank batch b) before the all-reduce and the average
    (B_big = k b) after it: two batch sizes of the same gradient, at no extra cost. The local
    |G_small|^2 is best averaged over the ranks too (one more scalar in the all-reduce).
    """

    def __init__(self, decay=0.95):
        if not 0 <= decay < 1:
            raise ValueError(f"decay must be in [0, 1), got {decay}")
        self.decay, self.g2, self.trace, self.steps = decay, 0.0, 0.0, 0

    def update(self, small_sq, big_sq, b_small, b_big):
        g2, trace = two_batch_estimates(float(small_sq), float(big_sq), b_small, b_big)
        self.steps += 1
        self.g2 = self.decay * self.g2 + (1 - self.decay) * g2
        self.trace = self.decay * self.trace + (1 - self.decay) * trace
        return self.b_simple

    @property
    def b_simple(self):
        """tr(Sigma) / |G|^2 of the averages (the bias of starting at 0 cancels in the ratio);
        inf while the signal's average is still <= 0 (the noise drowns it)."""
        return self.trace / self.g2 if self.g2 > 0 else float("inf")


# DIST_SGD_MINE: a learner's version replaces this one
swap_in(globals(), "noise_scale", ("two_batch_estimates",), lesson="18")
