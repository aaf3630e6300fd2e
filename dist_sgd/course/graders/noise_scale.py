"""Lesson 18's two_batch_estimates: |G|^2 and tr(Sigma) from squared gradient norms at two
batch sizes. Exact on exact expectations (the formulas are linear: within 1e-12), and unbiased
on sampled gradients of known covariance (the mean of 4000 estimates within 5 standard
errors)."""
import math

import torch

from dist_sgd.course.grade import Grader

grader = Grader("noise_scale")
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


@grader.case("unbiased on 4000 sampled batches of 4 and 32 (tensors in, tensors out)")
def sampled(ctx):
    """On 4000 sampled pairs of batches of known covariance the estimates average to |G|^2 and
    tr(Sigma) within the tolerance the sampling allows: unbiased, for tensors too."""
    gen = torch.Generator().manual_seed(0)
    G = torch.linspace(-1, 1, 20, dtype=torch.float64)
    sd = torch.linspace(0.5, 3.0, 20, dtype=torch.float64)
    examples = G + sd * torch.randn(4000, 32, 20, generator=gen, dtype=torch.float64)
    small = examples[:, :4].mean(1).square().sum(1)
    big = examples.mean(1).square().sum(1)
    g2, trace = ctx.call(ctx.impl.two_batch_estimates, small, big, 4, 32)
    for what, est, true in (("|G|^2", g2, G.square().sum()), ("tr(Sigma)", trace,
                                                               sd.square().sum())):
        ctx.expect(isinstance(est, torch.Tensor) and est.shape == small.shape,
                   f"{what}: expected a tensor of one estimate per batch")
        tolerance = 5 * est.std().item() / math.sqrt(len(est))
        ctx.expect(abs(est.mean().item() - true.item()) < tolerance,
                   f"{what}: the mean of 4000 estimates is {est.mean().item():.4f}, expected "
                   f"{true.item():.4f} (tolerance 5 standard errors, {tolerance:.4f})",
                   _fitting(g2, big))
