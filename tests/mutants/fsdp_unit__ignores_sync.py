"""Reduce-scatters on every backward, sync or not: under no_sync (gradient accumulation) the
point is to send nothing until the last backward, keeping the padded full gradient in
s.accumulated instead.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""

CAUGHT_BY = "no_sync: the full gradient kept, reduced with the next one"
HINT = "sync=False: keep the padded full gradient in s.accumulated, send nothing"
PATCH = [
    ("            if not sync:\n                s.accumulated = flat\n     "
     "           continue\n", ""),
]
