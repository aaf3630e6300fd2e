"""The column layer without f: its forward is right, but backward leaves each rank with the
input's gradient through its own slice only, never summed.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""

CAUGHT_BY = "column (gather_output=False) then row (input_is_parallel=True): one process"
PATCH = [
    ("        y = F.linear(CopyToParallel.apply(x, self.group, self.log), self.weight, self.bias)\n",
     "        y = F.linear(x, self.weight, self.bias)\n"),
]
