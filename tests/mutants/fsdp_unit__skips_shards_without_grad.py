"""Skips a shard whose .grad is None ("nothing to reduce"), reading the shard's own .grad
where the arriving gradient is meant: before the first backward every shard's .grad is None,
so nothing is ever reduce-scattered and .grad stays None. Under sync=True every shard that
requires grad gets its reduce-scatter.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""

CAUGHT_BY = "reduce-scatter: each rank gets its piece of the mean gradient, then adds"
HINT = "under sync=True every shard that requires grad gets a reduce-scatter"
PATCH = [
    ("            if not s.param.requires_grad:\n                continue\n",
     "            if not s.param.requires_grad or s.param.grad is None:\n  "
     "              continue\n"),
]
