"""Every forward, then every backward: GPipe's order, not 1F1B's. The same gradients, but
each stage holds all m micro-batches instead of at most p."""

CAUGHT_BY = "the order on every stage, step by step, m = 1, p and p + 3"
HINT = "the warm-up shrinks along the pipeline, p - 1 - s on stage s"


def one_f_one_b(stage_index, num_stages, n_microbatches):
    return [("F", i) for i in range(n_microbatches)] + [("B", i) for i in range(n_microbatches)]


def last_stage_loss(loss_fn, output, target, n_microbatches):
    return loss_fn(output, target)
