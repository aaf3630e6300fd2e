"""Uses process_group as it comes: DDP's register_comm_hook(None, hook) passes None for the
default group, and None has no size(). torch's hooks take `process_group or
dist.group.WORLD`.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""

CAUGHT_BY = "3 steps on torch's DDP: torch's fp16_compress_hook's gradients, bit for bit"
HINT = "process_group may be None: then use the default group"
PATCH = [
    ("    group = _group(process_group)\n", "    group = process_group\n"),
]
