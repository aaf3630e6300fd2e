"""Runs the module itself as the first replica and copy.deepcopy(module) as the others: the
output is right, but backward reaches the module's own parameters from the first chunk only;
the copies' gradients stay in the copies. Every replica's parameters must be autograd copies
of the module's (replicate), so that one backward sums all of them into the originals."""
CAUGHT_BY = "forward and backward, 7 rows over 3 replicas: one process's output and gradients"
HINT = "the replicas' parameters must be autograd"
PATCH = [("import time\n", "import copy\nimport time\n"),
         ("        replicas = replicate(self.module, self.devices[:len(ins)])\n",
          "        replicas = [self.module] + [copy.deepcopy(self.module) for _ in ins[1:]]\n")]
