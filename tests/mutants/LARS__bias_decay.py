"""Gives biases weight decay (no trust ratio), as torch's SGD would: the contract's plain
momentum SGD for one-dimensional tensors has no weight decay term.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""
CAUGHT_BY = "a matrix, a bias and a kernel: 4 steps, momentum 0.9, weight decay 5e-4"
HINT = "a tensor with one dimension took weight decay"
PATCH = [("                    step = g * lr", "                    step = (g + wd * p) * lr")]
