"""Lesson 18's two_batch_estimates: |G|^2 and tr(Sigma) from squared gradient norms at two
batch sizes. Exact on exact expectations (the formulas are linear: within 1e-12), and unbiased
on sampled gradients of known covariance (the mean of 4000 estimates within 5 standard
errors), where the signal is strong and where one term is weak (no clipping at zero)."""
import math

import torch

from dist_sgd.course.grade import Grader

TENSORS = "tensors in, tensors out: the same formulas, element by element (no float(), no .item())"
grader = Grader("noise_scale", error_hints={"only one element tensors can be converted": TENSORS})
HINTS = {
    "one": "E |G_B|^2 = |G|^2 + tr(Sigma) / B: the big batch's squared norm alone still holds "
           "tr(Sigma) / b_big of noise; combine both batch sizes",
    "solve": "two equations, small_sq = g2 + tr / b_small and big_sq = g2 + tr / b_big: solve "
             "for g2 and tr",
}


def _fitting(g2, big_sq):
    """The hint the estimate supports: |G|^2 that is the big batch's squared norm itself took
    one batch size; any other wrong pair solved the two equations wrongly."""
    try:
        one = bool(torch.allclose(torch.as_tensor(g2, dtype=torch.float64),
                                  torch.as_tensor(big_sq, dtype=torch.float64),
                                  rtol=1e-12, atol=0))
    except (TypeError, RuntimeError, ValueError):
        one = False
    return [HINTS["one"] if one else HINTS["solve"]]


@grader.case("exact expectations at batch sizes 8 and 64 give back |G|^2 and tr(Sigma)")
def exact(ctx):
    """Fed the exact expected squared norms at two batch sizes, the estimator gives back |G|^2 and
    tr(Sigma) exactly."""
    for g2, trace, bs, bb in ((2.5, 40.0, 8, 64), (0.01, 3.0, 1, 3), (7.0, 0.5, 32, 4096)):
        got = ctx.call(ctx.impl.two_batch_estimates, g2 + trace / bs, g2 + trace / bb, bs, bb)
        ctx.expect(isinstance(got, tuple) and len(got) == 2,
                   f"returned {type(got).__name__}, expected the pair (|G|^2, tr(Sigma))")
        for what, value, true in (("|G|^2", got[0], g2), ("tr(Sigma)", got[1], trace)):
            ctx.expect(abs(float(value) - true) <= 1e-12 * max(1.0, abs(true)),
                       f"batch sizes {bs} and {bb}: {what} is {float(value):.10g}, expected "
                       f"{true} (tolerance 1e-12)",
                       _fitting(got[0], g2 + trace / bb))


def _sample(G, sd, n=4000):
    """n pairs of squared norms, batches of 4 and 32 examples of mean G and deviations sd."""
    gen = torch.Generator().manual_seed(0)
    examples = G + sd * torch.randn(n, 32, len(G), generator=gen, dtype=torch.float64)
    return examples[:, :4].mean(1).square().sum(1), examples.mean(1).square().sum(1)


def _unbiased(ctx, G, sd, regime):
    """The estimates from 4000 sampled pairs average to |G|^2 and tr(Sigma) within 5 standard
    errors; the caller's tensors stay as they were."""
    small, big = _sample(G, sd)
    kept = small.clone(), big.clone()
    g2, trace = ctx.call(ctx.impl.two_batch_estimates, small, big, 4, 32)
    ctx.expect(torch.equal(small, kept[0]) and torch.equal(big, kept[1]),
               f"{regime}: the caller's small_sq or big_sq changed",
               ["tensors in stay as they are: an in-place op (-=, sub_) on an argument "
                "writes into the caller's tensor; compute into new ones"])
    right = (32 * big - 4 * small) / 28, (small - big) / (1 / 4 - 1 / 32)
    for what, est, true, ok in (("|G|^2", g2, G.square().sum(), right[0]),
                                ("tr(Sigma)", trace, sd.square().sum(), right[1])):
        ctx.expect(isinstance(est, torch.Tensor) and est.shape == small.shape,
                   f"{regime}: {what} is {type(est).__name__}, expected a tensor of one "
                   "estimate per batch", [TENSORS])
        tolerance = 5 * est.std().item() / math.sqrt(len(est))
        negative = int((ok < 0).sum())
        clipped = [f"none of your {len(est)} estimates of {what} is negative, where {negative} "
                   "of the unbiased ones are: clipped at zero (or made positive)? An unbiased "
                   "estimate of a small term must come out negative when the noise outweighs "
                   "it; keep the sign"] if negative and est.min() >= 0 else []
        ctx.expect(abs(est.mean().item() - true.item()) < tolerance,
                   f"{regime}: {what}: the mean of 4000 estimates is {est.mean().item():.4f}, "
                   f"expected {true.item():.4f} (tolerance 5 standard errors, {tolerance:.4f})",
                   clipped or _fitting(g2, big))


@grader.case("unbiased on 4000 sampled batches of 4 and 32 (tensors in, tensors out)")
def sampled(ctx):
    """On 4000 sampled pairs of batches of known covariance the estimates average to |G|^2 and
    tr(Sigma) within the tolerance the sampling allows: unbiased, for tensors too (one estimate
    per element, the caller's tensors left as they were)."""
    _unbiased(ctx, torch.linspace(-1, 1, 20, dtype=torch.float64),
              torch.linspace(0.5, 3.0, 20, dtype=torch.float64), "a strong signal")


@grader.case("unbiased where one term is weak: |G|^2 below tr(Sigma) / b_big, then tr(Sigma) "
             "small")
def weak(ctx):
    """Where the signal is weak (|G|^2 = 0.07 below tr(Sigma) / 32 = 2.3) about half of the
    unbiased estimates of |G|^2 are negative, and where the noise is weak (tr(Sigma) = 0.08) so
    are those of tr(Sigma): 4000 estimates of each still average to the true value within 5
    standard errors (an estimate clipped at zero does not)."""
    G = torch.linspace(-1, 1, 20, dtype=torch.float64)
    _unbiased(ctx, G / 10, torch.linspace(0.5, 3.0, 20, dtype=torch.float64), "a weak signal")
    _unbiased(ctx, G, torch.linspace(0.02, 0.1, 20, dtype=torch.float64), "weak noise")
