"""Asks for the end-of-backward wait in forward ("every step starts with a forward"): but
call_when_backward_ends queues the callback on the backward pass that is running, and in
forward none is. It must be called from a gradient hook, the first of each backward.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""

CAUGHT_BY = "one backward: every gradient averaged when backward() returns, rank 0 late"
HINT = "call_when_backward_ends only works while backward runs"
PATCH = [
    ("    def forward(self, *inputs, **kwargs):\n"
     "        return self.module(*inputs, **kwargs)\n",
     "    def forward(self, *inputs, **kwargs):\n"
     "        call_when_backward_ends(self.finish_gradient_synchronization)\n"
     "        return self.module(*inputs, **kwargs)\n"),
    ("        if not self._futures:  # first gradient of this backward: wait for all at its end\n"
     "            call_when_backward_ends(self.finish_gradient_synchronization)\n", ""),
]
