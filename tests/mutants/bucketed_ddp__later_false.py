"""Launches every bucket with in_order(start, later=False), the hook's too: later=False
promises that start issues all its collectives before it returns, but a communication hook
may issue more from a callback (PowerSGD: P, then Q). The next bucket then starts while the
hook is still issuing, and the ranks issue their collectives in different orders (gloo
pairs messages of different sizes: it aborts, or sums the wrong tensors). A hook's bucket
goes with later=True.

Written as changes to the reference (dist_sgd/course/skeleton.reference): each (old, new)
replaces text that occurs once in it, so the wrong version follows the reference as it changes."""

CAUGHT_BY = ("a hook with two collectives; at step 1 only rank 0 uses a layer: buckets "
             "launched together, in order")
HINT = "in_order(start, later=True), so the next bucket"
PATCH = [
    ("            bucket.future = in_order(lambda b=bucket: self.reduce(b) if self.reduce else\n"
     "                                     _all_reduce(b.flat), later=self.reduce is not None)\n",
     "            if self.reduce is not None:\n"
     "                bucket.future = in_order(lambda b=bucket: self.reduce(b), later=False)\n"
     "            else:\n"
     "                bucket.future = in_order(lambda b=bucket: _all_reduce(b.flat), "
     "later=False)\n"),
]
