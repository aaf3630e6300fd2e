"""All-gathers into a new tensor of the full size, not into views of the storage: the values
arrive there, and the storage (which the module's parameters are made on) keeps whatever its
fresh bytes held. self.tensor(i, (numel,)).split(s.size) are views of the storage.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""

CAUGHT_BY = "gather: the full weight and bias from every rank's piece"
HINT = "all-gather into self.tensor(i, (self.numels[i],)).split(s.size)"
PATCH = [
    ("            flat = self.tensor(i, (numel,))\n",
     "            flat = torch.empty(numel, dtype=self.dtypes[i])\n"),
]
