"""The residual added twice: once into the bucket, and once more (the learner 'makes sure'
it is in), so last step's error counts double.

Written as changes to the reference (dist_sgd/course/skeleton.reference): each (old, new)
replaces text that occurs once in it, so the wrong version follows the reference as it changes."""

CAUGHT_BY = "rank 1 with error feedback and warm start: torch's gradients, 5 steps"
HINT = "a later compressed step: the residual of the"
PATCH = [
    ("    pair different collectives (gloo aborts). So each bucket runs in_order (dist_sgd.comm.\n    ordered): the next bucket starts once this one's Q's are summed; no callback ever blocks a\n    gloo thread. (torch's powerSGD_hook waits inside its callbacks: on gloo, with several\n    buckets, it can hang or abort. On our DDP, which runs every hook in_order, it runs; on\n    torch's, wrap it: `lambda s, b: in_order(lambda: torch_powerSGD_hook(s, b))`.)\n",
     "    pair different collectives (gloo aborts). So each bucket runs in hooks.in_order: the next\n    bucket starts once this one's Q's are summed; no callback ever blocks a gloo thread. (torch's\n    powerSGD_hook waits inside its callbacks: on gloo, with several buckets, it can hang or\n    abort. On our DDP, which runs every hook in_order, it runs; on torch's, wrap it:\n    `lambda s, b: in_order(lambda: torch_powerSGD_hook(s, b))`.)\n"),
    ('        buffer.add_(state.error_dict[index])  # what we failed to send last step\n    else:\n',
     '        buffer.add_(state.error_dict[index])  # what we failed to send last step\n        buffer.add_(state.error_dict[index])\n    else:\n'),
]
