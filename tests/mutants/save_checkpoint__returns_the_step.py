"""load_checkpoint returns the step itself (an int), where its contract promises a dict
{"step": ..., "items": ..., ...}: the caller reads state["step"] (and the data position, the
sampler's state) from it.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""

CAUGHT_BY = "saved, then loaded into a fresh model: weights, momentum, learning rate"
HINT = "return {\"step\": the step saved} (None only when"
PATCH = [
    ('    saved_at = shared["world_size"]\n',
     '    return shared["step"]  # where the caller goes on from\n'
     '    saved_at = shared["world_size"]\n'),
]
