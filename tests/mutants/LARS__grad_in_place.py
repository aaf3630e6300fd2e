"""Builds the step inside p.grad, g.add_(p, alpha=wd).mul_(lr * trust): every weight is right,
but the caller's gradient now holds the step (and a gradient accumulated into next is wrong).

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""
CAUGHT_BY = "a matrix, a bias and a kernel: 4 steps, momentum 0.9, weight decay 5e-4"
HINT = "step() leaves p.grad as it is"
PATCH = [("                    step = (g + wd * p) * (lr * trust)",
          "                    step = g.add_(p, alpha=wd).mul_(lr * trust)")]
