"""g all-reduces x itself and returns it: the sum is right, but the caller's x (an
activation autograd may still need, the partial result of this rank) now holds every rank's
sum. torch's collectives write in place, so the sum goes into a clone.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""

CAUGHT_BY = "g: the partial sums added forward, the gradient passed through backward"
HINT = "all_reduce a clone: x itself must stay as it was"
PATCH = [
    ("        x = x.contiguous().clone()  # x stays as it is: autograd may need it\n", ""),
]
