"""free() always shrinks and counts the bytes out, even when the unit is free already: a
second free() (FSDP frees after forward and again after backward) counts -nbytes once
more, and the memory account goes negative. Freeing what is free does nothing.

Written as changes to the reference (dist_sgd/course/skeleton.reference): each (old, new)
replaces text that occurs once in it, so the wrong version follows the reference as it changes."""

CAUGHT_BY = "free: 0 bytes held; a tensor made before comes back with the next gather"
HINT = "free() a unit that is free already: nothing to do"
PATCH = [
    ('        if self.state != "free":\n'
     "            self.wait()  # a gather in flight writes into the storage: let it land first\n"
     "            for storage in self.storages:\n"
     "                storage.resize_(0)\n"
     '            self.state = "free"\n'
     "            self.memory.count(-self.nbytes)\n",
     '        self.wait() if self.state == "gathering" else None\n'
     "        for storage in self.storages:\n"
     "            storage.resize_(0)\n"
     '        self.state = "free"\n'
     "        self.memory.count(-self.nbytes)\n"),
]
