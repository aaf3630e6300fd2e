"""g all-reduces over every rank whatever group it is given: right with group=None (every case
of one group), wrong in a 2-D mesh where each tensor-parallel group sums among its own ranks.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""
CAUGHT_BY = "on a subgroup: evens and odds each sum among themselves"
HINT = "summed over every rank, not over group"
PATCH = [("        all_reduce(x, group=group)\n", "        all_reduce(x)\n")]
