"""Launches every complete bucket as soon as it is complete, whatever its place: on one rank
a layer used only there completes its buckets early, on the others only when backward ends,
so the ranks issue the all-reduces in different orders and gloo pairs different buckets
(wrong sums, or an abort on a size mismatch). Strictly in bucket order: bucket self._next
first, and stop at the first incomplete one.

Written as changes to the reference (dist_sgd/course/skeleton.reference): each (old, new)
replaces text that occurs once in it, so the wrong version follows the reference as it changes."""

CAUGHT_BY = ("a hook with two collectives; at step 1 only rank 0 uses a layer: buckets "
             "launched together, in order")
HINT = "a bucket was never launched: keep launching"
PATCH = [
    ("        while self._next < len(self.buckets) and all(self.buckets[self._next].ready):\n"
     "            bucket = self.buckets[self._next]\n"
     "            bucket.future = in_order(lambda b=bucket: self.reduce(b) if self.reduce else\n"
     "                                     _all_reduce(b.flat), later=self.reduce is not None)\n"
     "            self._next += 1\n",
     "        for bucket in self.buckets:\n"
     "            if bucket.future is None and all(bucket.ready):\n"
     "                if self.reduce is not None:\n"
     "                    bucket.future = in_order(lambda b=bucket: self.reduce(b), "
     "later=True)\n"
     "                else:\n"
     "                    bucket.future = in_order(lambda b=bucket: "
     "_all_reduce(b.flat), later=False)\n"
     "                self._next += 1\n"),
]
