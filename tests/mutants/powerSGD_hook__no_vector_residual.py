"""Keeps the residual as soon as the matrices are decompressed, before the plain vectors (the
biases) get their average: "only the matrices were compressed, so only they lose anything".
The vectors' residual comes out zero, where torch keeps this rank's vector minus the average
(it sums to zero over the ranks, so the next step's average is the same, but the state kept
is not torch's). The residual is the gradient before compression minus everything the ranks
agreed on, the averaged vectors included.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""

CAUGHT_BY = "rank 1 with error feedback and warm start: torch's gradients, 5 steps"
HINT = "error_dict[index] = the gradient before compression (its residual added) minus the P Q^T"
PATCH = [
    ("        copy_back(flat_vectors.div_(world_size), vectors)\n"
     "        decompress(matrices, ps, qs, q_flat, world_size)\n"
     "        if state.use_error_feedback:\n"
     "            keep_residual(state, index, before, buffer)\n",
     "        decompress(matrices, ps, qs, q_flat, world_size)\n"
     "        if state.use_error_feedback:  # only the matrices were compressed\n"
     "            keep_residual(state, index, before, buffer)\n"
     "        copy_back(flat_vectors.div_(world_size), vectors)\n"),
]
