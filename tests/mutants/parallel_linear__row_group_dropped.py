"""The row layer's g all-reduces over the default group: right when the layer spans every
rank, wrong in a 2-D mesh, where each tensor-parallel group must sum only its own partial
results.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""
CAUGHT_BY = "on a subgroup (evens, odds) with a log: group and log passed on to f and g"
HINT = "the partial sums were added over every rank, not over the layer's group"
PATCH = [("        y = ReduceFromParallel.apply(F.linear(x, self.weight), self.group, self.log)\n",
          "        y = ReduceFromParallel.apply(F.linear(x, self.weight), None, self.log)\n")]
