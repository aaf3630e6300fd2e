"""The shard stepped, then nothing shared: each rank's copy moves only where it owns the
parameters, and the ranks drift apart.

Written as changes to the reference (dist_sgd/course/skeleton.reference): each (old, new)
replaces text that occurs once in it, so the wrong version follows the reference as it changes."""

CAUGHT_BY = "3 Adam steps: plain Adam's weights on one process, on every rank"
HINT = "after its own step, each parameter must reach"
PATCH = [
    ('            self._broadcast_shards(shards)\n',
     ''),
]
