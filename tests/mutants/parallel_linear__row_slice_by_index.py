"""The row layer takes its slice of a whole x by indexing, x.chunk(p, -1)[rank]: the output is
right, but x's gradient then holds only this rank's slice, where ScatterToParallel's backward
all-gathers every rank's (in the pair with a gathering column layer the gather's backward hides
it; fed a whole x directly, it shows).

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""
CAUGHT_BY = "each layer alone on (batch, sequence, width) inputs, with a bias and without"
HINT = "x's gradient holds only this rank's slice"
PATCH = [("            x = ScatterToParallel.apply(x, self.group)\n",
          "            x = x.chunk(self.size, dim=-1)[self.rank]\n")]
