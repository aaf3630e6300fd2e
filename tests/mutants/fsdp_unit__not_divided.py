"""Reduce-scatters the gradients but never divides by the world size: each rank's piece
is the sum over the ranks, p times the mean DDP and one process give.

Written as changes to the reference (dist_sgd/course/skeleton.reference): each (old, new)
replaces text that occurs once in it, so the wrong version follows the reference as it changes."""

CAUGHT_BY = 'reduce-scatter: each rank gets its piece of the mean gradient, then adds'
HINT = "times too big: summed but not divided"
PATCH = [
    ('            out.div_(self.world_size)  # the sum over ranks -> the mean\n',
     ''),
]
