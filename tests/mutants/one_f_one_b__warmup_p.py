"""A warm-up of p forwards on every stage, as in GPipe's fill: every stage then holds p + 1
micro-batches at its peak, not p - s (and with blocking sends, the last stage waits on
forwards nobody has sent while the first waits on its backward: a deadlock).

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""

CAUGHT_BY = "the order on every stage, step by step, m = 1, p and p + 3"
HINT = "the warm-up shrinks along the pipeline, p - 1 - s on stage s"
PATCH = [
    ("    warmup = min(num_stages - 1 - stage_index, n_microbatches)\n",
     "    warmup = min(num_stages, n_microbatches)\n"),
]
