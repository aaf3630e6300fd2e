"""free() gives the storages' bytes back but does not say so to self.memory: the count still
shows the full parameters held, and FSDP's peak memory is then wrong from the first free on.
Every byte counted in is counted out: self.memory.count(-self.nbytes).

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""

CAUGHT_BY = "free: 0 bytes held; a tensor made before comes back with the next gather"
HINT = "self.memory.count(-self.nbytes)"
PATCH = [
    ("            self.state = \"free\"\n            self.memory.count(-self.nbytes)\n",
     "            self.state = \"free\"\n"),
]
