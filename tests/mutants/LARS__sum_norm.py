"""Divides by the norm of the whole step, |g + wd * w|, rather than |g| + wd * |w|: a natural
reading of "the norm of the update", but Algorithm 1 adds the two norms (the triangle
inequality's bound, not the norm itself).

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""
CAUGHT_BY = "a matrix, a bias and a kernel: 4 steps, momentum 0.9, weight decay 5e-4"
HINT = "two norms added, not by the norm of the sum"
PATCH = [("""                        g_norm + wd * w_norm + group["eps"])""",
          """                        (g + wd * p).norm() + group["eps"])""")]
