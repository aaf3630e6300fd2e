"""free() shrinks the storages at once, without waiting for a gather still in flight: the
all-gather then writes its pieces into memory that was given back (with a late peer both
ranks can crash, or other tensors get overwritten). Wait for the gather first
(self.wait()), then resize_(0).

Written as changes to the reference (dist_sgd/course/skeleton.reference): each (old, new)
replaces text that occurs once in it, so the wrong version follows the reference as it changes."""

CAUGHT_BY = "free() while the gather is in flight (rank 0 late): it waits for the gather first"
HINT = "free(): wait for the gather in flight first"
PATCH = [
    ('        if self.state != "free":\n'
     "            self.wait()  # a gather in flight writes into the storage: let it land first\n"
     "            for storage in self.storages:\n"
     "                storage.resize_(0)\n"
     '            self.state = "free"\n'
     "            self.memory.count(-self.nbytes)\n",
     '        if self.state == "free":\n'
     "            return\n"
     "        for storage in self.storages:\n"
     "            storage.resize_(0)\n"
     '        self.works, self.state = [], "free"\n'
     "        self.memory.count(-self.nbytes)\n"),
]
