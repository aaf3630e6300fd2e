"""The warm-up p - 1 - s without min(., m): right while m >= p - 1, but with fewer
micro-batches than stages stage 0 runs forwards of micro-batches that do not exist.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""
CAUGHT_BY = "the order on every stage, step by step, m = 1, p and p + 3"
HINT = "the warm-up is min(p - 1 - s, m) forwards, never more than m"
PATCH = [("    warmup = min(num_stages - 1 - stage_index, n_microbatches)\n",
          "    warmup = num_stages - 1 - stage_index\n")]
