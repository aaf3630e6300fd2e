"""f keeps no group for backward and sums the gradients over every rank: right with
group=None, wrong on a subgroup.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""
CAUGHT_BY = "on a subgroup: evens and odds each sum among themselves"
HINT = "f's backward summed over every rank, not over its group"
PATCH = [("        all_reduce(grad, group=ctx.group)\n", "        all_reduce(grad)\n")]
