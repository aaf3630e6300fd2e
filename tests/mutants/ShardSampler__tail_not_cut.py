"""With drop_last, keeps the whole order in indices() and takes every num_replicas-th index of
it in __iter__ (order[rank::num_replicas]): when n does not divide by the world size, the first
n % num_replicas ranks get one index more than the others, and their extra step leaves the
others waiting in an all-reduce. DistributedSampler cuts the order to total_size first."""
CAUGHT_BY = "drop_last=True: n = 11, 12 and smaller than the world size"
HINT = "with drop_last every rank gets n // num_replicas indices"
PATCH = [("            return order[:self.total_size]\n", "            return order\n"),
         ("self.indices()[self.rank:self.total_size:self.num_replicas]",
          "self.indices()[self.rank::self.num_replicas]")]
