"""The loss divided by the micro-batch count, as gradient accumulation does by hand; but the
schedule already divides the gradients by m (scale_grads): m times too small."""

CAUGHT_BY = "two steps of a 1F1B pipeline: gradients and weights of one process"
PATCH = [
    ("    return loss_fn(output, target)\n",
     "    return loss_fn(output, target) / n_microbatches\n"),
]
