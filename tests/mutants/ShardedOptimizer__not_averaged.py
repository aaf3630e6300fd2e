"""Steps the shard with this rank's own gradient, never averaged over the ranks: each owner
then updates its parameters from 1/p of the global batch, and what it broadcasts is not
what one process on the whole batch would compute. Average first (reduce_gradients).

Written as changes to the reference (dist_sgd/course/skeleton.reference): each (old, new)
replaces text that occurs once in it, so the wrong version follows the reference as it changes."""

CAUGHT_BY = "3 Adam steps: plain Adam's weights on one process, on every rank"
HINT = "the ranks agree, but not with one process"
PATCH = [
    ("            if self.reduce_gradients:  # every gradient averaged everywhere, as "
     "plain DDP does\n"
     "                n = sum(g.numel() * g.element_size() for g in "
     "gradients_to_sync(self._trainable()))\n"
     "                average_gradients(self._trainable(), flat=True, "
     "all_reduce=self.comm.all_reduce)\n"
     "                self.comm_log.append((\"all_reduce\", n))\n",
     ""),
]
