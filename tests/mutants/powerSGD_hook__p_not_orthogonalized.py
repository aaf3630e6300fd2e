"""P used as summed, never orthogonalized: P Q^T = P P^T M then scales M by |P|^2
instead of projecting it.

Written as changes to the reference (dist_sgd/course/skeleton.reference): each (old, new)
replaces text that occurs once in it, so the wrong version follows the reference as it changes."""

CAUGHT_BY = "rank 1 without error feedback: torch's gradients, 5 steps"
HINT = "the first compressed step: P = M Q, the P's"
PATCH = [
    ("    pair different collectives (gloo aborts). So each bucket runs in_order (dist_sgd.comm.\n    ordered): the next bucket starts once this one's Q's are summed; no callback ever blocks a\n    gloo thread. (torch's powerSGD_hook waits inside its callbacks: on gloo, with several\n    buckets, it can hang or abort. On our DDP, which runs every hook in_order, it runs; on\n    torch's, wrap it: `lambda s, b: in_order(lambda: torch_powerSGD_hook(s, b))`.)\n",
     "    pair different collectives (gloo aborts). So each bucket runs in hooks.in_order: the next\n    bucket starts once this one's Q's are summed; no callback ever blocks a gloo thread. (torch's\n    powerSGD_hook waits inside its callbacks: on gloo, with several buckets, it can hang or\n    abort. On our DDP, which runs every hook in_order, it runs; on torch's, wrap it:\n    `lambda s, b: in_order(lambda: torch_powerSGD_hook(s, b))`.)\n"),
    ('        orthogonalize(p, epsilon)\n',
     ''),
]
