"""Adds no_sync's kept gradient into the next synchronized one but never clears it: every
later synchronized backward sends it again, so from the second one on the shard's .grad
holds that old gradient twice, three times... Once sent, s.accumulated = None.

Written as changes to the reference (dist_sgd/course/skeleton.reference): each (old, new)
replaces text that occurs once in it, so the wrong version follows the reference as it changes."""

CAUGHT_BY = "no_sync: the full gradient kept, reduced with the next one"
HINT = "once a synchronized backward has sent s.accumulated, clear it"
PATCH = [
    ("            s.accumulated, out = None, s.param.new_empty(s.size)\n",
     "            pass\n"
     "            out = s.param.new_empty(s.size)\n"),
]
