"""One bucket per call: `if` where it takes `while`. When one gradient (or the flush of
the unused parameters at the end of backward) completes several buckets, the later ones are
never sent.

Written as changes to the reference (dist_sgd/course/skeleton.reference): each (old, new)
replaces text that occurs once in it, so the wrong version follows the reference as it changes."""

CAUGHT_BY = 'a layer no rank uses in one step: every bucket still sent, its gradient None'
HINT = "a bucket was never launched: keep launching"
PATCH = [
    ('        while self._next < len(self.buckets) and all(self.buckets[self._next].ready):\n',
     '        if self._next < len(self.buckets) and all(self.buckets[self._next].ready):\n'),
]
