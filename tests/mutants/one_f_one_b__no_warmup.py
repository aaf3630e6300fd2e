""""One forward, one backward" read literally: every stage alternates from the start, with no
warm-up. Stage 0's second forward then waits for its first backward, which needs the forward
to have crossed the whole pipeline first: the stages take turns, never all busy at once. The
stages before the last run p - 1 - s forwards ahead before the first backward.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""

CAUGHT_BY = "the order on every stage, step by step, m = 1, p and p + 3"
HINT = "stage s must run ahead of the later stages by p - 1 - s forwards"
PATCH = [
    ("    warmup = min(num_stages - 1 - stage_index, n_microbatches)\n",
     "    warmup = 0  # one forward, one backward, from the start\n"),
]
