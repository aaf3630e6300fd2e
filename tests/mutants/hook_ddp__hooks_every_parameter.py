"""Hooks every parameter, frozen ones too: autograd computes no gradient for a parameter that
does not require one, so it takes no hook (torch refuses to register it), and its .grad stays
None. Hook only the parameters with requires_grad.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""

CAUGHT_BY = "one backward: every gradient averaged when backward() returns, rank 0 late"
HINT = "a frozen parameter keeps .grad None: hook only the parameters that require a gradient"
PATCH = [
    ("        self._hooks = hook_gradients([p for p in module.parameters() if p.requires_grad],\n",
     "        self._hooks = hook_gradients(list(module.parameters()),\n"),
]
