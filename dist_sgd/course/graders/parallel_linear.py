"""Lesson 20's ColumnParallelLinear and RowParallelLinear: this rank's slice of an nn.Linear
(from_linear), and the two joined both ways against one process's pair of layers."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from dist_sgd.course.grade import Grader

grader = Grader("parallel_linear")


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
