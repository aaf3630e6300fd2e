"""Orthogonalizes each rank's own P in compute_p, before the P's are summed (then again after):
orthogonalizing is not linear, so the sum of orthogonalized P's is not the orthogonalized sum,
and the ranks no longer project on the summed gradient's directions as torch's hook does.
Orthogonalize once, after the sum (compute_q).

Written as changes to the reference (dist_sgd/course/skeleton.reference): each (old, new)
replaces text that occurs once in it, so the wrong version follows the reference as it changes."""

CAUGHT_BY = "rank 1 with error feedback and warm start: torch's gradients, 5 steps"
HINT = "the first compressed step: P = M Q, the P's"
PATCH = [
    ("    for mat, q, p in zip(matrices, qs, ps):\n"
     "        p.copy_(torch.matmul(q.t(), mat.t()).t())\n",
     "    for m, q, p in zip(matrices, qs, ps):\n"
     "        p.copy_(m @ q)\n"
     "        orthogonalize(p)\n"),
]
