"""Lesson 20's CopyToParallel (f) and ReduceFromParallel (g): Megatron's conjugate operators,
each graded forward and backward alone (f with its input used twice and its incoming gradient
the caller's), then joining an MLP split by columns and rows, noting their all-reduces in log,
and on a subgroup."""
import torch
import torch.distributed as dist
import torch.nn.functional as F

from dist_sgd.course.grade import Grader

grader = Grader("tp_operators")
IN_PLACE = "f's backward summed autograd's incoming gradient in place: that tensor is the " \
           "caller's (y.backward(v)) or shared with x's other uses; all-reduce a clone of it"
SWAPPED = "f and g swapped? f (CopyToParallel) is the identity forward; g (ReduceFromParallel) " \
          "all-reduces forward"


def _x(ctx):
    return torch.randn(3, 5, dtype=torch.float64,
                       generator=torch.Generator().manual_seed(10 + ctx.rank))


@grader.case("f: identity forward, the ranks' gradients summed backward")
def f_case(ctx):
    """f leaves x as it is going forward and sums the ranks' gradients coming back (an all-reduce
    in backward only); y.backward(v) leaves the caller's v as it was."""
    x = _x(ctx).requires_grad_()
    y = ctx.call(ctx.impl.CopyToParallel.apply, x, None)
    ctx.expect_close(y, x.detach(), "f(x)", atol=0, hints=[SWAPPED, "f's forward sends nothing"])
    v = torch.full_like(x, ctx.rank + 1.0)  # each rank's own upstream gradient
    y.backward(v)
    ctx.expect(torch.equal(v, torch.full_like(x, ctx.rank + 1.0)),
               "the caller's v changed in y.backward(v) through f", [IN_PLACE])
    total = sum(range(1, ctx.world_size + 1))
    ctx.expect(x.grad is not None, "x.grad is None after backward through f")
    ctx.expect_close(x.grad, torch.full_like(x, float(total)), "x.grad through f", atol=1e-12,
                     hints=["f's backward sums the ranks' gradients: all_reduce a clone of "
                            "grad"] if torch.equal(x.grad, torch.full_like(x, ctx.rank + 1.0))
                     else [])


@grader.case("f with x used twice: out = 3 x + f(x), x.grad and the caller's v")
def f_twice(ctx):
    """x used twice, out = 3 x + f(x): x.grad = 3 v + the ranks' v summed, and out.backward(v)
    leaves the caller's v as it was (f's backward must not write into its incoming gradient)."""
    x = _x(ctx).requires_grad_()
    v = torch.randn(3, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(ctx.rank))
    kept, total = v.clone(), v.clone()
    dist.all_reduce(total)
    out = 3 * x + ctx.call(ctx.impl.CopyToParallel.apply, x, None)
    ctx.call(out.backward, v)
    ctx.expect(x.grad is not None, "x.grad is None after out.backward(v)")
    changed = not torch.equal(v, kept)
    ctx.expect_close(x.grad, 3 * kept + total, "x.grad of 3 x + f(x)", atol=1e-12,
                     hints=[IN_PLACE] if changed or torch.allclose(x.grad, 4 * total) else [])
    ctx.expect(not changed, "the caller's v changed in out.backward(v)", [IN_PLACE])


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


@grader.case("the all-reduces noted in log: g's in forward, f's in backward")
def noted(ctx):
    """Given a list as log, g notes its forward all-reduce and f its backward one, each once
    with _log(log, tensor, "g" or "f", "forward" or "backward"): the entries lesson 20 counts."""
    x, log = _x(ctx).requires_grad_(), []
    f, g = ctx.impl.CopyToParallel.apply, ctx.impl.ReduceFromParallel.apply
    y = ctx.call(lambda: g(f(x, None, log), None, log))
    forward = [(e.get("op"), e.get("pass")) for e in log if isinstance(e, dict)]
    y.backward(torch.ones_like(y))
    noted = [(e.get("op"), e.get("pass")) for e in log if isinstance(e, dict)]
    expected = [("g", "forward"), ("f", "backward")]
    ctx.expect((forward, noted) == (expected[:1], expected),
               f"log holds {forward} after forward and {noted} after backward, expected "
               f"{expected[:1]}, then {expected}",
               ["f noted an all-reduce in forward, where f sends nothing: its all-reduce runs in "
                "backward, note it there, _log(ctx.log, grad, \"f\", \"backward\")"]
               if ("f", "forward") in noted else
               ["call _log(log, tensor, op, pass_) once after each all-reduce: in g's forward "
                "_log(log, x, \"g\", \"forward\"), in f's backward _log(ctx.log, grad, \"f\", "
                "\"backward\") (keep log from forward on ctx)"])
    ctx.expect(all(isinstance(e, dict) and e.get("bytes") == x.numel() * 8 for e in log),
               f"log holds {log}, expected {x.numel() * 8} bytes in each entry "
               "(the all-reduced tensor's)")


@grader.case("on a subgroup: evens and odds each sum among themselves", world_sizes=(2, 4))
def subgroup(ctx):
    """With group= a subgroup (the even ranks, the odd ranks), g sums forward and f sums backward
    over that group's ranks only."""
    r, p = ctx.rank, ctx.world_size
    groups = [dist.new_group(list(range(start, p, 2))) for start in (0, 1)]
    members = list(range(r % 2, p, 2))
    x = _x(ctx).requires_grad_()
    f, g = ctx.impl.CopyToParallel.apply, ctx.impl.ReduceFromParallel.apply
    y = ctx.call(lambda: g(f(x, groups[r % 2]), groups[r % 2]))
    xs = [torch.randn(3, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(10 + q))
          for q in range(p)]
    every = sum(xs)
    ctx.expect_close(y, sum(xs[q] for q in members), f"g(x) over ranks {members}", atol=1e-12,
                     hints=["summed over every rank, not over group: pass group= to the "
                            "all-reduce"] if torch.allclose(y, every) else [])
    y.backward(torch.full_like(y, r + 1.0))
    ctx.expect_close(x.grad, torch.full_like(y, sum(q + 1.0 for q in members)),
                     f"x.grad through f over ranks {members}", atol=1e-12,
                     hints=["f's backward summed over every rank, not over its group: keep group "
                            "on ctx in forward, pass it to the all-reduce"] if torch.allclose(
                         x.grad, torch.full_like(y, p * (p + 1) / 2.0)) else [])
