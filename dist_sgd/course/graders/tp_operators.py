"""Lesson 20's CopyToParallel (f) and ReduceFromParallel (g): Megatron's conjugate operators,
each graded forward and backward alone, then joining an MLP split by columns and rows."""
import torch
import torch.distributed as dist
import torch.nn.functional as F

from dist_sgd.course.grade import Grader

grader = Grader("tp_operators")
SWAPPED = "f and g swapped? f (CopyToParallel) is the identity forward; g (ReduceFromParallel) " \
          "all-reduces forward"


def _x(ctx):
    return torch.randn(3, 5, dtype=torch.float64,
                       generator=torch.Generator().manual_seed(10 + ctx.rank))


@grader.case("f: identity forward, the ranks' gradients summed backward")
def f_case(ctx):
    """f leaves x as it is going forward and sums the ranks' gradients coming back (an all-reduce
    in backward only)."""
    x = _x(ctx).requires_grad_()
    y = ctx.call(ctx.impl.CopyToParallel.apply, x, None)
    ctx.expect_close(y, x.detach(), "f(x)", atol=0, hints=[SWAPPED, "f's forward sends nothing"])
    y.backward(torch.full_like(x, ctx.rank + 1.0))  # each rank's own upstream gradient
    total = sum(range(1, ctx.world_size + 1))
    ctx.expect(x.grad is not None, "x.grad is None after backward through f")
    ctx.expect_close(x.grad, torch.full_like(x, float(total)), "x.grad through f", atol=1e-12,
                     hints=["f's backward sums the ranks' gradients: all_reduce a clone of "
                            "grad"] if torch.equal(x.grad, torch.full_like(x, ctx.rank + 1.0))
                     else [])


@grader.case("g: the partial sums added forward, the gradient passed through backward")
def g_case(ctx):
    """g sums the ranks' partial results going forward and passes the gradient through unchanged
    coming back; the input is left as it was."""
    x = _x(ctx).requires_grad_()
    everyone = x.detach().clone()
    dist.all_reduce(everyone)
    y = ctx.call(ctx.impl.ReduceFromParallel.apply, x, None)
    ctx.expect_close(y, everyone, "g(x)", atol=1e-12, own=x.detach(), hints=[SWAPPED])
    y.backward(torch.full_like(x, ctx.rank + 1.0))
    ctx.expect(x.grad is not None, "x.grad is None after backward through g")
    ctx.expect_close(x.grad, torch.full_like(x, ctx.rank + 1.0), "x.grad through g", atol=1e-12,
                     hints=["g's backward is the identity: each term of a sum gets the sum's "
                            "gradient as it is; all-reduced again, it counts p times"])
    ctx.expect_close(x.detach(), _x(ctx), "x after g", atol=0,
                     hints=["all_reduce a clone: x itself must stay as it was"])


@grader.case("an MLP, A by columns and B by rows, joined by f and g: one process's numbers")
def mlp(ctx):
    """f and g around a column-split A and a row-split B: the output and the gradients of X, A and
    B equal one process's (this rank's slices of them)."""
    p, r = ctx.world_size, ctx.rank
    torch.manual_seed(1)
    a, b = torch.randn(5, 4 * p, dtype=torch.float64), torch.randn(4 * p, 3, dtype=torch.float64)
    x = torch.randn(6, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    mine = [a.chunk(p, 1)[r].clone().requires_grad_(), b.chunk(p, 0)[r].clone().requires_grad_()]
    xx = x.clone().requires_grad_()
    f, g = ctx.impl.CopyToParallel.apply, ctx.impl.ReduceFromParallel.apply
    y = ctx.call(lambda: g(F.gelu(f(xx, None) @ mine[0]) @ mine[1], None))
    ctx.call(y.sum().backward)
    x.requires_grad_(), a.requires_grad_(), b.requires_grad_()
    ref = F.gelu(x @ a) @ b
    ref.sum().backward()
    ctx.expect_close(y, ref, "Y = g(gelu(f(X) A_r) B_r)", atol=1e-12, rtol=1e-9)
    ctx.expect_close(xx.grad, x.grad, "X's gradient", atol=1e-12, rtol=1e-9)
    ctx.expect_close(mine[0].grad, a.grad.chunk(p, 1)[r], "A's slice's gradient", atol=1e-12,
                     rtol=1e-9)
    ctx.expect_close(mine[1].grad, b.grad.chunk(p, 0)[r], "B's slice's gradient", atol=1e-12,
                     rtol=1e-9)
