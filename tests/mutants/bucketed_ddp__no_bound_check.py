"""Looks at self.buckets[self._next] without checking that there is one: past the last
bucket, an IndexError inside backward.

Written as changes to the reference (dist_sgd/course/skeleton.reference): each (old, new)
replaces text that occurs once in it, so the wrong version follows the reference as it changes."""

CAUGHT_BY = "three steps in 2 KB buckets: torch DDP's gradients bit for bit"
HINT = "stop at the last bucket: self._next <"
PATCH = [
    ('        while self._next < len(self.buckets) and all(self.buckets[self._next].ready):\n',
     '        while all(self.buckets[self._next].ready):\n'),
]
