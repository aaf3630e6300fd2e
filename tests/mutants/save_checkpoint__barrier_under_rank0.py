"""The last barrier of save_checkpoint indented under `if rank == 0:` (with the writing of
`latest` it guards): rank 0 makes one more collective than the others, which go on to their
next one and pair it with rank 0's barrier. Every rank makes the same collective calls in the
same order: the barrier belongs to every rank.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""

CAUGHT_BY = "each rank's own random generators come back"
HINT = "a rank waited for a message that never came: every rank must make the same collective"
PATCH = [
    ("        _remove_old(ckpt_dir, keep)\n"
     "    _barrier()  # nobody reads `latest` (or leaves) before it moved\n",
     "        _remove_old(ckpt_dir, keep)\n"
     "        _barrier()  # nobody reads `latest` (or leaves) before it moved\n"),
]
