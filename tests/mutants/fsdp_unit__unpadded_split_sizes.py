"""Cuts the gradient, unpadded, into p pieces of s.size with split([s.size] * p): when p does
not divide the parameter's size (91 = 46 + 45 at p = 2) the sizes add up to more than the
gradient holds. The gradient is padded with zeros to s.size * p first, as the shards are.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""

CAUGHT_BY = "reduce-scatter: each rank gets its piece of the mean gradient, then adds"
HINT = "pad each gradient with zeros to s.size * p elements before cutting it"
PATCH = [
    ("                flat = s.param.new_zeros(s.size * self.world_size)  #"
     " padded, the shard's dtype\n",
     "                flat = s.param.new_zeros(s.numel)\n"),
    ("            work = self.comm.start(\"reduce_scatter\", out, list(flat.split(s.size)))\n",
     "            work = self.comm.start(\"reduce_scatter\", out,\n"
     "                                   list(flat.split([s.size] * self.world_size)))\n"),
]
