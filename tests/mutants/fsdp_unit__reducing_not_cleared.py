"""finish_reduce() waits for the reduce-scatters and sets .grad, but leaves them in
self.reducing: the next finish_reduce() adds the old means again. Once done, each is
counted out and the list emptied.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""

CAUGHT_BY = "reduce-scatter: each rank gets its piece of the mean gradient, then adds"
HINT = "count each padded gradient in, and out again when its reduce-scatter is done"
PATCH = [
    ("            self.memory.count(-flat.numel() * flat.element_size())\n "
     "       self.reducing = []\n",
     "            self.memory.count(-flat.numel() * flat.element_size())\n"),
]
