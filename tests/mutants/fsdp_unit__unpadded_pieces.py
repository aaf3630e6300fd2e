"""Sends the gradient unpadded, cut by flat.split(s.size): when p does not divide the
parameter's size the last piece is shorter (91 = 46 + 45 at p = 2), and a reduce-scatter
needs every rank's pieces of one size, the shard's. Pad with zeros to s.size * p first.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""

CAUGHT_BY = "reduce-scatter: each rank gets its piece of the mean gradient, then adds"
HINT = "every piece an all-gather fills, and every piece a reduce-scatter sends, has s.size"
PATCH = [
    ("                flat = s.param.new_zeros(s.size * self.world_size)  #"
     " padded, the shard's dtype\n",
     "                flat = s.param.new_zeros(s.numel)\n"),
]
