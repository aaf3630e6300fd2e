"""__iter__ returns this rank's list of indices: Python's iter(sampler), which a DataLoader
calls, then refuses it (iter() returned non-iterator of type 'list'). __iter__ must return an
iterator: iter(the list), or be a generator (yield from the list)."""
CAUGHT_BY = "shuffle=False, n = 12 and 10: the strided split"
HINT = "__iter__ must return an iterator"
PATCH = [("return iter(self.indices()[self.rank:self.total_size:self.num_replicas])",
          "return self.indices()[self.rank:self.total_size:self.num_replicas]")]
