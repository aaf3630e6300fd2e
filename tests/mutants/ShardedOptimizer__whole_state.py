"""Every rank's optimizer over every parameter: each rank steps them all, the broadcasts
hand round the same values, so the weights are right, but every rank keeps the whole Adam
state: no memory saved, which was the point.

Written as changes to the reference (dist_sgd/course/skeleton.reference): each (old, new)
replaces text that occurs once in it, so the wrong version follows the reference as it changes."""

CAUGHT_BY = "the Adam state: each parameter's on one rank only (1/p of it per rank)"
HINT = "the wrapped optimizer must be built over this"
PATCH = [
    ('        local = [self._local_group(g, o) for g, o in zip(self.param_groups, self.owners)]\n',
     "        local = [{**g, 'params': list(g['params'])} for g in self.param_groups]\n"),
]
