"""Computes the count per rank in a local variable of __init__ and keeps only self.total_size:
the indices are right, but __len__ (the sampler's contract, which a DataLoader's len() asks)
returns self.num_samples, which was never set."""
CAUGHT_BY = "shuffle=False, n = 12 and 10: the strided split"
HINT = "__init__ sets self.num_samples"
PATCH = [("self.num_samples = n // num_replicas", "num_samples = n // num_replicas"),
         ("self.num_samples = math.ceil(n / num_replicas)",
          "num_samples = math.ceil(n / num_replicas)"),
         ("self.total_size = self.num_samples * num_replicas",
          "self.total_size = num_samples * num_replicas")]
