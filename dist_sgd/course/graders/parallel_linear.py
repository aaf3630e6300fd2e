"""Lesson 20's ColumnParallelLinear and RowParallelLinear: this rank's slice of an nn.Linear
(from_linear), the two joined both ways against one process's pair of layers, each alone on
every input the contract allows (3-D, with and without a bias), and on a subgroup with a log."""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from dist_sgd.course.grade import Grader

grader = Grader("parallel_linear", error_hints={
    "unsupported operand type(s) for +": "a layer built with bias=False has self.bias None: add "
                                         "the bias only where there is one",
    "must be a matrix": "x may have any number of leading dimensions (batch, sequence, ...): "
                        "F.linear takes them all, mm and addmm only matrices"})


def _pair(p):
    torch.manual_seed(1)
    return nn.Linear(5, 4 * p).double(), nn.Linear(4 * p, 3).double()


@grader.case("from_linear: a column layer keeps its rows, a row layer its columns and the bias")
def slices(ctx):
    """from_linear takes this rank's slice: a column layer the rows of W (and of b), a row layer
    the columns of W and the whole bias, added once."""
    p, r = ctx.world_size, ctx.rank
    first, second = _pair(p)
    col = ctx.call(ctx.impl.ColumnParallelLinear.from_linear, first)
    row = ctx.call(ctx.impl.RowParallelLinear.from_linear, second)
    ctx.expect_close(col.weight.detach(), first.weight.detach().chunk(p, 0)[r],
                     "the column layer's weight", atol=0,
                     hints=["a column-parallel layer splits the outputs: rows of nn.Linear's "
                            "(out, in) weight, chunk(p, dim=0)"])
    ctx.expect_close(col.bias.detach(), first.bias.detach().chunk(p)[r], "the column layer's "
                     "bias", atol=0, hints=["each rank adds its slice of the bias to its slice"])
    ctx.expect_close(row.weight.detach(), second.weight.detach().chunk(p, 1)[r],
                     "the row layer's weight", atol=0,
                     hints=["a row-parallel layer splits the inputs: columns, chunk(p, dim=1)"])
    ctx.expect_close(row.bias.detach(), second.bias.detach(), "the row layer's bias", atol=0,
                     hints=["the row layer's bias is whole on every rank: it is added once, "
                            "after the all-reduce"])


def _both_ways(ctx, gathered):
    p, r = ctx.world_size, ctx.rank
    first, second = _pair(p)
    x = torch.randn(6, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    col = ctx.impl.ColumnParallelLinear.from_linear(first, gather_output=gathered)
    row = ctx.impl.RowParallelLinear.from_linear(second, input_is_parallel=not gathered)
    xx = x.clone().requires_grad_()
    y = ctx.call(lambda: row(F.gelu(col(xx))))
    ctx.call(y.sum().backward)
    x.requires_grad_()
    ref = second(F.gelu(first(x)))
    ref.sum().backward()
    bias_twice = ["the bias counts p times: add the row layer's bias after the all-reduce"] \
        if p > 1 and torch.allclose(y.detach(), ref.detach() + (p - 1) * second.bias) else []
    ctx.expect_close(y, ref.detach(), "the output", atol=1e-12, rtol=1e-9, hints=bias_twice)
    ctx.expect_close(xx.grad, x.grad, "the input's gradient", atol=1e-12, rtol=1e-9)
    for name, got, want in (("column weight", col.weight.grad, first.weight.grad.chunk(p)[r]),
                            ("column bias", col.bias.grad, first.bias.grad.chunk(p)[r]),
                            ("row weight", row.weight.grad, second.weight.grad.chunk(p, 1)[r]),
                            ("row bias", row.bias.grad, second.bias.grad)):
        ctx.expect(got is not None, f"the {name} has no gradient")
        ctx.expect_close(got, want, f"the {name}'s gradient", atol=1e-12, rtol=1e-9)


@grader.case("column (gather_output=False) then row (input_is_parallel=True): one process")
def split_between(ctx):
    """Column layer without gathering, row layer on the parallel input: the output and every
    gradient equal one process's two nn.Linear."""
    _both_ways(ctx, False)


@grader.case("column (gather_output=True) then row (input_is_parallel=False): one process")
def gathered_between(ctx):
    """Column layer gathering its output, row layer taking the full input: the same numbers as one
    process's two nn.Linear."""
    _both_ways(ctx, True)


def _alone(ctx, layer, full, x, split_in, split_out, what):
    """layer(x) on this rank against full(x) on the whole input: the output (this rank's slice
    of its last dimension where split_out) and x's gradient (its slice where split_in), with
    the loss sum(y * w) for one w every rank shares (its slice where split_out)."""
    p, r = ctx.world_size, ctx.rank
    w = torch.randn(*x.shape[:-1], full.out_features, dtype=torch.float64,
                    generator=torch.Generator().manual_seed(4))
    mine = (lambda t: t.chunk(p, -1)[r]) if p > 1 else (lambda t: t)
    xx = (mine(x) if split_in else x).clone().requires_grad_()
    y = ctx.call(layer, xx)
    ctx.call(lambda: (y * (mine(w) if split_out else w)).sum().backward())
    xr = x.clone().requires_grad_()
    ref = full(xr)
    (ref * w).sum().backward()
    ctx.expect_close(y, (mine(ref) if split_out else ref).detach(), f"{what}: the output",
                     atol=1e-12, rtol=1e-9)
    ctx.expect(xx.grad is not None, f"{what}: x.grad is None after backward")
    want = mine(xr.grad) if split_in else xr.grad
    sliced = not split_in and p > 1 and torch.allclose(mine(xx.grad), mine(xr.grad)) and \
        torch.count_nonzero(xx.grad) == torch.count_nonzero(mine(xx.grad))
    ctx.expect_close(xx.grad, want, f"{what}: x's gradient", atol=1e-12, rtol=1e-9,
                     hints=["x's gradient holds only this rank's slice: take the slice with "
                            "ScatterToParallel (its backward all-gathers the slices' gradients), "
                            "not by indexing x"] if sliced else [])


@grader.case("each layer alone on (batch, sequence, width) inputs, with a bias and without")
def alone(ctx):
    """Each layer on its own, fed what the contract allows: x with two leading dimensions, every
    gather_output and input_is_parallel, layers with and without a bias; output and x's gradient
    equal one process's nn.Linear (this rank's slices where split)."""
    p = ctx.world_size
    x = torch.randn(2, 3, 2 * p, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    for bias in (True, False):
        torch.manual_seed(3)
        first = nn.Linear(2 * p, 2 * p, bias=bias).double()
        kind = "with a bias" if bias else "bias=False"
        for flag in (True, False):
            col = ctx.call(ctx.impl.ColumnParallelLinear.from_linear, first, gather_output=flag)
            _alone(ctx, col, first, x, False, not flag,
                   f"column layer, {kind}, gather_output={flag}")
            row = ctx.call(ctx.impl.RowParallelLinear.from_linear, first, input_is_parallel=flag)
            _alone(ctx, row, first, x, flag, False,
                   f"row layer, {kind}, input_is_parallel={flag}")


@grader.case("on a subgroup (evens, odds) with a log: group and log passed on to f and g",
             world_sizes=(2, 4))
def passed_on(ctx):
    """Layers built with group= a subgroup and log= a list: the pair's output and x's gradient
    equal one process's over the group's slices, and log holds g's forward all-reduce, then
    f's backward one (group and log passed on to f and g)."""
    r, p = ctx.rank, ctx.world_size
    groups = [dist.new_group(list(range(start, p, 2))) for start in (0, 1)]
    q, log = len(range(r % 2, p, 2)), []
    first, second = _pair(q)
    x = torch.randn(6, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    col = ctx.impl.ColumnParallelLinear.from_linear(first, False, groups[r % 2], log)
    row = ctx.impl.RowParallelLinear.from_linear(second, True, groups[r % 2], log)
    xx, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
    y = ctx.call(lambda: row(F.gelu(col(xx))))
    forward = [(e["op"], e["pass"]) for e in log]
    ctx.call(y.sum().backward)
    ref = second(F.gelu(first(xr)))
    ref.sum().backward()
    every = torch.allclose(y.detach(), (ref - second.bias) * (p // q) + second.bias)
    ctx.expect_close(y, ref.detach(), f"the output on a group of {q}", atol=1e-12, rtol=1e-9,
                     hints=["the partial sums were added over every rank, not over the layer's "
                            "group: hand self.group to g"] if every and p > q else [])
    ctx.expect_close(xx.grad, xr.grad, "x's gradient", atol=1e-12, rtol=1e-9)
    noted = [(e["op"], e["pass"]) for e in log]
    ctx.expect((forward, noted) == ([("g", "forward")], [("g", "forward"), ("f", "backward")]),
               f"log holds {forward} after forward and {noted} after backward, expected g's "
               "forward all-reduce, then f's backward one",
               ["hand the layer's log to f and g: CopyToParallel.apply(x, self.group, "
                "self.log), ReduceFromParallel.apply(partial, self.group, self.log)"])
