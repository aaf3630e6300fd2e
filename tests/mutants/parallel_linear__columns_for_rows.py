"""The column-parallel layer cut along the weight's columns (dim=1): "column" read as the
weight's columns, where Megatron means the columns of A in X A, the rows of nn.Linear's
(out, in) weight.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""

CAUGHT_BY = "from_linear: a column layer keeps its rows, a row layer its columns and the bias"
PATCH = [
    ("            layer.weight.copy_(linear.weight.chunk(layer.size, dim=0)[layer.rank])\n",
     "            layer.weight.copy_(linear.weight.chunk(layer.size, dim=1)[layer.rank])\n"),
]
