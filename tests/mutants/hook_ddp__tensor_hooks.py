"""Hooks each parameter with tensor.register_hook, which autograd calls with the gradient
before it is accumulated into .grad: on the first backward param.grad is still None there
(and later it holds the previous step's). The hook that runs once param.grad is set is
register_post_accumulate_grad_hook (hook_gradients).

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""

CAUGHT_BY = "one backward: every gradient averaged when backward() returns, rank 0 late"
HINT = "the hook runs once param.grad is accumulated: param.grad is set there"
PATCH = [
    ("        self._hooks = hook_gradients([p for p in module.parameters() if p.requires_grad],\n"
     "                                     self._grad_ready)\n",
     "        self._hooks = [p.register_hook(lambda grad, p=p: self._grad_ready(p))\n"
     "                       for p in module.parameters() if p.requires_grad]\n"),
]
