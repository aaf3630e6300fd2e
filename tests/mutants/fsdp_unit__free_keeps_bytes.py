"""free() only marks the unit free: the storages keep their bytes, so ZeRO-3 holds every
gathered unit at once, as if it were not sharded at all.

Written as changes to the reference (dist_sgd/course/skeleton.reference): each (old, new)
replaces text that occurs once in it, so the wrong version follows the reference as it changes."""

CAUGHT_BY = 'free: 0 bytes held; a tensor made before comes back with the next gather'
HINT = "storage.resize_(0) for each of self.storages:"
PATCH = [
    ('            for storage in self.storages:\n                storage.resize_(0)\n',
     ''),
]
