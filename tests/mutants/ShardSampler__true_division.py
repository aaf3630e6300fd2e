"""Rounds up with (n + num_replicas - 1) / num_replicas, the integer trick written with / where
it needs //: num_samples is a float (12.0, or 6.5), and counting this rank's positions with
range(self.num_samples) fails. A count of indices is an int: math.ceil(n / num_replicas), or
(n + num_replicas - 1) // num_replicas."""
CAUGHT_BY = "shuffle=False, n = 12 and 10: the strided split"
HINT = "num_samples must be an int"
PATCH = [("self.num_samples = math.ceil(n / num_replicas)",
          "self.num_samples = (n + num_replicas - 1) / num_replicas"),
         ("return iter(self.indices()[self.rank:self.total_size:self.num_replicas])",
          "order = self.indices()\n"
          "        return iter([order[self.rank + i * self.num_replicas]\n"
          "                     for i in range(self.num_samples)])")]
