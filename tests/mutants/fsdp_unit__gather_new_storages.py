"""gather() makes a new storage of the full size each time instead of growing the one it
has: the values arrive, but a tensor made on the storage before the last free() (a weight
autograd saved for backward) stays on the old storage, resized to 0 bytes, and never comes
back. storage.resize_ up and down keeps the same storage under every tensor made on it.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""

CAUGHT_BY = "free: 0 bytes held; a tensor made before comes back with the next gather"
HINT = "resize the storages, never replace them"
PATCH = [
    ("            storage.resize_(numel * itemsize(self.dtypes[i]))\n",
     "            self.storages[i] = torch.empty(numel, dtype=self.dtypes[i]).untyped_storage()\n"),
]
