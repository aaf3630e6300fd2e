"""Scales only the gradient by the trust ratio and adds weight decay after it, lr * (trust * g +
wd * w), as torch's SGD adds weight decay to the gradient: Algorithm 1 scales the whole step.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""
CAUGHT_BY = "a matrix, a bias and a kernel: 4 steps, momentum 0.9, weight decay 5e-4"
HINT = "weight decay went outside the trust ratio"
PATCH = [("                    step = (g + wd * p) * (lr * trust)",
          "                    step = (g * trust + wd * p) * lr")]
