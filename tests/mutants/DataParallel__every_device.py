"""Every device gets a replica, even when the batch gives fewer chunks (5 rows on 4 devices:
3 chunks): the fourth replica has no input.

Written as changes to the reference (dist_sgd/course/skeleton.reference): each (old, new)
replaces text that occurs once in it, so the wrong version follows the reference as it changes."""

CAUGHT_BY = '5 rows over 4 replicas (3 chunks), 1 row over 2, and 1 replica'
HINT = "torch's chunk may give fewer chunks than"
PATCH = [
    ('        replicas = replicate(self.module, self.devices[:len(ins)])\n',
     '        replicas = replicate(self.module, self.devices)\n'),
]
