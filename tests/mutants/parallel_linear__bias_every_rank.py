"""The row layer's bias added by every rank before the all-reduce (F.linear with the bias):
the sum then holds it p times.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""

CAUGHT_BY = "column (gather_output=False) then row (input_is_parallel=True): one process"
HINT = "the bias counts p times: add the row layer's bias after"
PATCH = [
    ("        y = ReduceFromParallel.apply(F.linear(x, self.weight), self.group, self.log)\n"
     "        return y if self.bias is None else y + self.bias\n",
     "        return ReduceFromParallel.apply(F.linear(x, self.weight, self.bias), self.group,\n"
     "                                        self.log)\n"),
]
