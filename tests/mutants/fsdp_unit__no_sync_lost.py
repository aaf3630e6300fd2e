"""Forgets what no_sync kept: the first synchronized backward reduces only its own
gradient, and the accumulated micro-batches are lost.

Written as changes to the reference (dist_sgd/course/skeleton.reference): each (old, new)
replaces text that occurs once in it, so the wrong version follows the reference as it changes."""

CAUGHT_BY = 'no_sync: the full gradient kept, reduced with the next one'
HINT = "add s.accumulated to the padded gradient, then"
PATCH = [
    ('                if s.accumulated is not None:\n                    flat += s.accumulated\n',
     ''),
]
