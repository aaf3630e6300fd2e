"""Lesson 18's SyncBatchNorm pieces: global_moments (forward's all-reduced mean, variance,
1/std, count) and global_means (backward's means of dy and dy * xhat), each against the
statistics of the global batch in one process, on uneven local batches; then the module built
on them against BatchNorm on the global batch: output, input and weight gradients, running
statistics. float64, within 1e-10."""
import torch
import torch.nn as nn

from dist_sgd.course.grade import Grader

TOL = 1e-10
HINTS = {
    "moments": "means and variances do not add up across ranks, sums do: all-reduce the sums "
               "of x and of x^2 and the counts, then mean = sum / n, var = E[x^2] - mean^2",
    "count": "local batches differ in size: divide by the global count (all-reduced), never "
             "by the local one or by the world size",
    "means": "both of backward's means are over the global batch: all-reduce the sums of dy "
             "and of dy * xhat, then divide by the global count",
    "unbiased": "this is the unbiased variance (divided by n - 1): BatchNorm normalizes with the "
                "biased one, sum(x^2) / n - mean^2 (the module makes running_var unbiased itself)",
    "eps": "invstd = 1 / sqrt(var + eps): eps goes inside the root, where it keeps a constant "
           "channel from dividing by 0",
    "type": "count is a tensor of one element in x's dtype (the all-reduced count itself): "
            "forward saves it for backward and hands it to global_means",
    "in_place": "global_means leaves dy2d and xhat2d as they are (backward uses dy2d again "
                "after it): compute dy2d * xhat2d into a new tensor, never with mul_",
    "formula": "over the global batch: mean = sum(x) / n, var = sum(x^2) / n - mean^2 (biased), "
               "invstd = rsqrt(var + eps), with the sums and n all-reduced",
}
grader = Grader("SyncBatchNorm", error_hints={"'int' object has no attribute": HINTS["type"],
                                              "save_for_backward can only save": HINTS["type"]})


def _data(ctx, channels=5, seed=0):
    sizes = [(3, 1, 4, 2)[r] for r in range(ctx.world_size)]  # uneven local batches
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(sum(sizes), channels, generator=gen, dtype=torch.float64) * 2 + 3
    dy = torch.randn(sum(sizes), channels, generator=gen, dtype=torch.float64)
    mine = slice(sum(sizes[:ctx.rank]), sum(sizes[:ctx.rank + 1]))
    return x, dy, mine


def _scaled(got, expected):
    """got is expected times one factor other than 1, the same in every channel."""
    if not torch.is_tensor(got) or got.shape != expected.shape or not expected.all():
        return False
    ratio = got.double() / expected
    return bool(torch.allclose(ratio, ratio[0].expand_as(ratio), rtol=1e-9, atol=0)
                and not torch.isclose(ratio[0], torch.ones((), dtype=ratio.dtype), rtol=1e-9))


def _fits(got, expected):
    return torch.is_tensor(got) and got.shape == expected.shape and bool(
        torch.allclose(got.double(), expected, rtol=1e-9, atol=1e-12))


def _moment_hints(got, x, sizes):
    """The hints for (mean, var, invstd) read off what they equal instead: a count scaled by
    one factor, the ranks' own moments averaged, the unbiased variance, eps outside the root."""
    mean, var = x.mean(0), x.var(0, unbiased=False)
    parts = x.split(sizes)
    if _scaled(got[0], mean):
        return [HINTS["count"]]
    averaged = sum(q.mean(0) for q in parts) / len(parts), sum(
        q.var(0, unbiased=False) for q in parts) / len(parts)
    if any(_fits(g, a) and not _fits(a, e) for g, a, e in zip(got, averaged, (mean, var))):
        return [HINTS["moments"]]
    if _fits(got[1], x.var(0, unbiased=True)):
        return [HINTS["unbiased"]]
    if _fits(got[1], var) and _fits(got[2], torch.rsqrt(var)):
        return [HINTS["eps"]]
    return [HINTS["formula"]]


@grader.case("global_moments on uneven local batches (3, 1, 4, 2 rows)")
def moments(ctx):
    """global_moments on local batches of different sizes: the global mean, biased variance,
    invstd and count (a one-element tensor of x's dtype), equal on every rank to one process's
    over the whole batch."""
    x, _, mine = _data(ctx)
    got = ctx.call(ctx.impl.global_moments, x[mine].clone(), 1e-5)
    ctx.expect(isinstance(got, tuple) and len(got) == 4,
               "expected (mean, var, invstd, count)")
    mean, var = x.mean(0), x.var(0, unbiased=False)
    hints = _moment_hints(got, x, [(3, 1, 4, 2)[r] for r in range(ctx.world_size)])
    ctx.expect_close(got[0], mean, "the mean", atol=TOL, hints=hints)
    ctx.expect_close(got[1], var, "the (biased) variance", atol=TOL, hints=hints)
    ctx.expect_close(got[2], torch.rsqrt(var + 1e-5), "invstd", atol=TOL, hints=hints)
    ctx.expect(torch.is_tensor(got[3]) and got[3].numel() == 1 and got[3].dtype == x.dtype,
               f"count is {got[3]!r}, expected a one-element tensor of dtype {x.dtype}",
               [HINTS["type"]])
    ctx.expect(float(got[3]) == len(x), f"count {float(got[3])}, expected {len(x)} (the "
               "global batch)", [HINTS["count"]])


@grader.case("global_means of dy and dy * xhat on uneven local batches")
def means(ctx):
    """global_means: the global means of dy and dy * xhat, both all-reduced, equal to one
    process's over the whole batch."""
    x, dy, mine = _data(ctx, seed=1)
    xhat = (x - x.mean(0)) * torch.rsqrt(x.var(0, unbiased=False) + 1e-5)
    n = torch.tensor(float(len(x)), dtype=torch.float64)
    mine_dy, mine_xhat = dy[mine].clone(), xhat[mine].clone()
    got = ctx.call(ctx.impl.global_means, mine_dy, mine_xhat, n)
    ctx.expect(isinstance(got, tuple) and len(got) == 2, "expected (mean_dy, mean_dy_xhat)")
    ctx.expect(torch.equal(mine_dy, dy[mine]) and torch.equal(mine_xhat, xhat[mine]),
               "global_means changed its dy2d or xhat2d", [HINTS["in_place"]])
    ctx.expect_close(got[0], dy.mean(0), "mean(dy)", atol=TOL, hints=[HINTS["means"]])
    ctx.expect_close(got[1], (dy * xhat).mean(0), "mean(dy * xhat)", atol=TOL,
                     hints=[HINTS["means"]])


def _output_hints(y, x, mine):
    """The hint for a wrong output (weight 1, bias 0) read off what it equals: BatchNorm with
    the unbiased variance, or with this rank's own statistics."""
    dims = (0, 2, 3)
    for var, hint in ((x.var(dims, unbiased=True, keepdim=True), "unbiased"),
                      (x[mine].var(dims, unbiased=False, keepdim=True), "moments")):
        centre = x.mean(dims, keepdim=True) if hint == "unbiased" else \
            x[mine].mean(dims, keepdim=True)
        if _fits(y, ((x - centre) * torch.rsqrt(var + 1e-5))[mine]):
            return [HINTS[hint]]
    return [HINTS["formula"]]


@grader.case("SyncBatchNorm on these pieces vs BatchNorm2d on the global batch, 2 steps",
             world_sizes=(2, 3, 4))  # at world size 1 the module is BatchNorm itself
def module(ctx):
    """The learner's pieces inside SyncBatchNorm: outputs, input and weight gradients and running
    statistics after 2 steps equal to BatchNorm2d on the global batch in one process."""
    from dist_sgd.large_batch import syncbn
    saved = syncbn.global_moments, syncbn.global_means
    syncbn.global_moments, syncbn.global_means = ctx.impl.global_moments, ctx.impl.global_means
    try:
        sizes = [(2, 3, 1, 2)[r] for r in range(ctx.world_size)]
        mine = slice(sum(sizes[:ctx.rank]), sum(sizes[:ctx.rank + 1]))
        gen = torch.Generator().manual_seed(2)
        ours, ref = syncbn.SyncBatchNorm(3).double(), nn.BatchNorm2d(3).double()
        for step in range(2):
            x = torch.randn(sum(sizes), 3, 2, 3, generator=gen, dtype=torch.float64) + step
            w = torch.randn(x.shape, generator=gen, dtype=torch.float64)
            xg, xl = x.clone().requires_grad_(), x[mine].clone().requires_grad_()
            expected = ref(xg)
            (expected * w).sum().backward()
            y = ctx.call(ours, xl)
            ctx.call((y * w[mine]).sum().backward)
            ctx.expect_close(y.detach(), expected[mine].detach(), f"step {step}: the output",
                             atol=TOL, hints=_output_hints(y.detach(), x, mine))
            ctx.expect_close(xl.grad, xg.grad[mine], f"step {step}: the input's gradient",
                             atol=TOL, hints=[HINTS["means"]])
        ctx.expect_close(ours.running_var, ref.running_var, "running_var after 2 steps",
                         atol=TOL, hints=[HINTS["count"]])
    finally:
        syncbn.global_moments, syncbn.global_means = saved
