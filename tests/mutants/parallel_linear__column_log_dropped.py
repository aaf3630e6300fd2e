"""The column layer calls f without its log: every number is right, but f's backward
all-reduce goes uncounted, and lesson 20's report of all-reduces per pass is short of one.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""
CAUGHT_BY = "on a subgroup (evens, odds) with a log: group and log passed on to f and g"
HINT = "hand the layer's log to f and g"
PATCH = [("        y = F.linear(CopyToParallel.apply(x, self.group, self.log), self.weight, self.bias)\n",
          "        y = F.linear(CopyToParallel.apply(x, self.group), self.weight, self.bias)\n")]
