"""The replicas are copy.deepcopy(module): each has parameters of its own, so backward
fills the copies' .grad and the module's own parameters get none.

Written as changes to the reference (dist_sgd/course/skeleton.reference): each (old, new)
replaces text that occurs once in it, so the wrong version follows the reference as it changes."""

CAUGHT_BY = "forward and backward, 7 rows over 3 replicas: one process's output and gradients"
HINT = "the replicas' parameters must be autograd"
PATCH = [
    ('import time\n',
     'import copy\nimport time\n'),
    ('        replicas = replicate(self.module, self.devices[:len(ins)])\n',
     '        replicas = [copy.deepcopy(self.module) for _ in ins]\n'),
]
