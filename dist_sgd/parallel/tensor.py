"""Tensor parallelism, Megatron's way: one layer's weight split across the ranks of a group.

    f  = CopyToParallel.apply(x, group)       identity forward, all-reduce backward
    g  = ReduceFromParallel.apply(x, group)   all-reduce forward, identity backward
    ColumnParallelLinear(in, out, gather_output=True, group=None)   W's rows (outputs) split
    RowParallelLinear(in, out, input_is_parallel=False, group=None) W's columns (inputs) split
    ColumnParallelLinear.from_linear(linear, ...), RowParallelLinear.from_linear(linear, ...)
                                              this rank's slice of a full nn.Linear

An MLP Y = act(X A) B: A split by columns of its output (rank r computes X A_r, no message),
then B split by rows of its input (rank r computes act(X A_r) B_r, a partial sum): one
all-reduce (g) makes Y. Backward is the mirror: g passes the gradient through, and f, before
the column layer, sums the ranks' partial input gradients. The row layer's bias is added once,
after the all-reduce. Attention splits the same way by heads (lesson 20). f and g are
conjugate: each is the other's backward.

Every all-reduce is ours (dist_sgd.comm.collectives, group= a subgroup in a 2-D mesh);
`log`, a list, receives {"op", "pass", "bytes"} per all-reduce, to count them.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from dist_sgd.comm.collectives import all_gather, all_reduce
from dist_sgd.plumbing.mine import swap_in
from dist_sgd.plumbing.rank import world

__all__ = ["CopyToParallel", "ReduceFromParallel", "GatherFromParallel", "ScatterToParallel",
           "ColumnParallelLinear", "RowParallelLinear"]


def _log(log, x, op, pass_):
    """One all-reduce of x, noted in `log` (a list, or None: not counted). f and g call it once
    each, right after their all-reduce, with the tensor all-reduced: g in its forward,
    _log(log, x, "g", "forward"); f in its backward, _log(ctx.log, grad, "f", "backward").
    Lesson 20 counts the entries ({"op", "pass", "bytes"}) per pass."""
    if log is not None:
        log.append({"op": op, "pass": pass_, "bytes": x.numel() * x.element_size()})


class CopyToParallel(torch.autograd.Function):
    """f: every rank gets x as it is; in backward each rank holds the gradient of its own
    slice's contribution only, so the gradients are summed over the ranks of `group` (None:
    all of them). Backward's incoming gradient is autograd's (the caller's v in y.backward(v),
    or shared with x's other uses): sum a copy, never it in place. After the all-reduce, note
    it: _log(ctx.log, summed, "f", "backward")."""

    @staticmethod
    def forward(ctx, x, group=None, log=None):
        ctx.group, ctx.log = group, log
        # ---- exercise tp_operators: f's forward (x on every rank as it is)
        return x.view_as(x)
        # ---- end of exercise

    @staticmethod
    def backward(ctx, grad):
        # ---- exercise tp_operators: f's backward (the gradients of every rank's slice summed)
        grad = grad.contiguous().clone()  # autograd's own tensor stays as it is
        all_reduce(grad, group=ctx.group)
        _log(ctx.log, grad, "f", "backward")
        return grad, None, None
        # ---- end of exercise


class ReduceFromParallel(torch.autograd.Function):
    """g: the ranks' partial sums (over `group`; None: every rank) added up in forward, into a
    new tensor (x stays as it is); the gradient of a sum reaches each term unchanged, so
    backward passes it through. After the all-reduce, note it: _log(log, summed, "g",
    "forward")."""

    @staticmethod
    def forward(ctx, x, group=None, log=None):
        # ---- exercise tp_operators: g's forward (the ranks' partial sums added up)
        x = x.contiguous().clone()  # x stays as it is: autograd may need it
        all_reduce(x, group=group)
        _log(log, x, "g", "forward")
        return x
        # ---- end of exercise

    @staticmethod
    def backward(ctx, grad):
        # ---- exercise tp_operators: g's backward (each term of a sum gets the gradient as is)
        return grad, None, None
        # ---- end of exercise


class GatherFromParallel(torch.autograd.Function):
    """Every rank's slice of the last dimension, concatenated; backward keeps this rank's."""

    @staticmethod
    def forward(ctx, x, group=None):
        ctx.rank, ctx.size = size = world("GatherFromParallel", group)
        size = ctx.size
        parts = [torch.empty_like(x) for _ in range(size)]
        all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, grad):
        return grad.chunk(ctx.size, dim=-1)[ctx.rank].contiguous(), None


class ScatterToParallel(torch.autograd.Function):
    """This rank's slice of the last dimension; backward all-gathers the slices' gradients."""

    @staticmethod
    def forward(ctx, x, group=None):
        rank, size = world("ScatterToParallel", group)
        ctx.group = group
        return x.chunk(size, dim=-1)[rank].contiguous()

    @staticmethod
    def backward(ctx, grad):
        return GatherFromParallel.apply(grad, ctx.group), None


def _share(n, what, size):
    """n / size, the slice each rank holds, or a ValueError naming `what` when size does not
    divide n."""
    if n % size:
        raise ValueError(f"{what} = {n} is not divisible by the tensor-parallel size {size}: "
                         "every rank must hold an equal slice (pad the layer)")
    return n // size


class ColumnParallelLinear(nn.Module):
    """y = x W^T + b with W's rows (the outputs) split: rank r holds out_features / p of them
    and computes its slice of y with no message. gather_output=True all-gathers the slices
    (False: leave them split, for a RowParallelLinear with input_is_parallel=True).

    x: (..., in_features), any leading dimensions (a transformer's (batch, sequence, width)).
    bias=False leaves self.bias None. x goes through f with the layer's group and log,
    CopyToParallel.apply(x, self.group, self.log), so x's gradient is summed over the group."""

    def __init__(self, in_features, out_features, bias=True, gather_output=True, group=None,
                 log=None, dtype=None, device=None):
        super().__init__()
        self.rank, self.size = world("ColumnParallelLinear", group)
        self.group, self.gather_output, self.log = group, gather_output, log
        local = _share(out_features, "out_features", self.size)
        self.weight = nn.Parameter(torch.empty(local, in_features, dtype=dtype, device=device))
        self.bias = nn.Parameter(torch.zeros(local, dtype=dtype, device=device)) if bias else None

    def forward(self, x):
        # ---- exercise parallel_linear: f, this rank's slice of y, gathered if gather_output
        y = F.linear(CopyToParallel.apply(x, self.group, self.log), self.weight, self.bias)
        return GatherFromParallel.apply(y, self.group) if self.gather_output else y
        # ---- end of exercise

    @classmethod
    def from_linear(cls, linear, gather_output=True, group=None, log=None):
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None,
                    gather_output, group, log, linear.weight.dtype, linear.weight.device)
        with torch.no_grad():
            # ---- exercise parallel_linear: this rank's rows of the weight and of the bias
            layer.weight.copy_(linear.weight.chunk(layer.size, dim=0)[layer.rank])
            if linear.bias is not None:
                layer.bias.copy_(linear.bias.chunk(layer.size)[layer.rank])
            # ---- end of exercise
        return layer


class RowParallelLinear(nn.Module):
    """y = x W^T + b with W's columns (the inputs) split: rank r multiplies its slice of x by
    its in_features / p columns, a partial sum; g adds the partial sums, then the bias is
    added once. input_is_parallel=False: x is whole, and each rank takes its slice first
    with ScatterToParallel (whose backward all-gathers the slices' gradients, so x's gradient
    is whole on every rank).

    x: (..., in_features, or its slice), any leading dimensions. bias=False leaves self.bias
    None. The partial sums go through g with the layer's group and log,
    ReduceFromParallel.apply(partial, self.group, self.log)."""

    def __init__(self, in_features, out_features, bias=True, input_is_parallel=False,
                 group=None, log=None, dtype=None, device=None):
        super().__init__()
        self.rank, self.size = world("RowParallelLinear", group)
        self.group, self.input_is_parallel, self.log = group, input_is_parallel, log
        local = _share(in_features, "in_features", self.size)
        self.weight = nn.Parameter(torch.empty(out_features, local, dtype=dtype, device=device))
        self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype,
                                                     device=device)) if bias else None

    def forward(self, x):
        # ---- exercise parallel_linear: x's slice unless input_is_parallel, partial sums, g, bias
        if not self.input_is_parallel:
            x = ScatterToParallel.apply(x, self.group)
        y = ReduceFromParallel.apply(F.linear(x, self.weight), self.group, self.log)
        return y if self.bias is None else y + self.bias
        # ---- end of exercise

    @classmethod
    def from_linear(cls, linear, input_is_parallel=False, group=None, log=None):
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None,
                    input_is_parallel, group, log, linear.weight.dtype, linear.weight.device)
        with torch.no_grad():
            # ---- exercise parallel_linear: this rank's columns of the weight; the whole bias
            layer.weight.copy_(linear.weight.chunk(layer.size, dim=1)[layer.rank])
            if linear.bias is not None:
                layer.bias.copy_(linear.bias)
            # ---- end of exercise
        return layer


# DIST_SGD_MINE: a learner's version replaces this one
swap_in(globals(), "tp_operators", ("CopyToParallel", "ReduceFromParallel"), lesson="20")
swap_in(globals(), "parallel_linear", ("ColumnParallelLinear", "RowParallelLinear"), lesson="20")
