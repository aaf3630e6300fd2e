"""Hands the wrapped optimizer this rank's shard as one list of parameters: it makes one
group with the constructor's options, so what a parameter group set for itself (its lr,
its weight decay) is lost, and those parameters train with the defaults. The wrapped
optimizer needs this rank's part of each group, options included.

Written as changes to the reference (dist_sgd/course/skeleton.reference): each (old, new)
replaces text that occurs once in it, so the wrong version follows the reference as it changes."""

CAUGHT_BY = "two parameter groups with their own lr and weight decay: plain Adam's weights"
HINT = "one local group per group"
PATCH = [
    ("        local = [self._local_group(g, o) for g, o in zip(self.param_groups, "
     "self.owners)]\n"
     "        self.optim = optimizer_class(local, **kwargs)\n",
     "        self.optim = optimizer_class(self.shard(), **kwargs)\n"),
]
