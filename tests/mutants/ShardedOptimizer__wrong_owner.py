"""Every parameter broadcast from rank 0: the ranks agree again, but on rank 0's copy,
where only rank 0's shard was stepped; the rest never moves.

Written as changes to the reference (dist_sgd/course/skeleton.reference): each (old, new)
replaces text that occurs once in it, so the wrong version follows the reference as it changes."""

CAUGHT_BY = "3 Adam steps: plain Adam's weights on one process, on every rank"
HINT = "the ranks agree, but not with one process"
PATCH = [
    ('                    works.append(dist.broadcast(p, src=r, async_op=True))\n',
     '                    works.append(dist.broadcast(p, src=0, async_op=True))\n'),
]
