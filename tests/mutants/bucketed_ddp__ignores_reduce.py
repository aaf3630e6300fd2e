"""Always the plain all-reduce, also when a communication hook is set: the gradients
were copied unscaled for the hook, so they come back summed, p times too big.

Written as changes to the reference (dist_sgd/course/skeleton.reference): each (old, new)
replaces text that occurs once in it, so the wrong version follows the reference as it changes."""

CAUGHT_BY = "with a communication hook (reduce): the hook's averages"
HINT = ("with self.reduce set, the bucket's average is",
        "times too big: summed but not divided")
PATCH = [
    ('            bucket.future = in_order(lambda b=bucket: self.reduce(b) if self.reduce else\n                                     _all_reduce(b.flat), later=self.reduce is not None)\n',
     '            bucket.future = in_order(lambda b=bucket: _all_reduce(b.flat), later=False)\n'),
]
