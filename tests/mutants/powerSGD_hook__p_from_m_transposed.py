"""Computes P from M^T (P = M^T Q): M is n x m and Q is m x r, so M^T (m x n) cannot multiply
Q, and even where the sizes fit (a square M) P would be the wrong factor. P = M Q is n x r;
Q = M^T P is m x r.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""

CAUGHT_BY = "rank 1 with error feedback and warm start: torch's gradients, 5 steps"
HINT = "P = M Q is n x r (M is n x m, Q is m x r)"
PATCH = [
    ("        p.copy_(torch.matmul(q.t(), mat.t()).t())\n",
     "        p.copy_(torch.matmul(mat.t(), q))\n"),
]
