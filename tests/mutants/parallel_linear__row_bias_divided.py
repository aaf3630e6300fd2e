"""The row layer's bias split as b / p on every rank and added before the all-reduce, so the
sum holds it once: the output is right, but every rank's copy of the parameter is b / p, not
nn.Linear's bias (saved, or compared with one process's layer, it is p times too small, and
weight decay treats it as another parameter). The row layer holds the whole bias and adds it
once, after the all-reduce.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""

CAUGHT_BY = "from_linear: a column layer keeps its rows, a row layer its columns and the bias"
HINT = ("the row layer's bias is whole on every rank: it is added once, after the all-reduce",
        "times too small: divided twice")
PATCH = [
    ("        y = ReduceFromParallel.apply(F.linear(x, self.weight), self.group, self.log)\n"
     "        return y if self.bias is None else y + self.bias\n",
     "        return ReduceFromParallel.apply(F.linear(x, self.weight, self.bias), self.group,\n"
     "                                        self.log)  # p shares of b / p: b once\n"),
    ("                layer.bias.copy_(linear.bias)\n",
     "                layer.bias.copy_(linear.bias / layer.size)\n"),
]
