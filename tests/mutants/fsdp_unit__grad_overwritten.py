"""Sets .grad to the new mean instead of adding it: a second backward without zero_grad
(gradient accumulation) loses the first one.

Written as changes to the reference (dist_sgd/course/skeleton.reference): each (old, new)
replaces text that occurs once in it, so the wrong version follows the reference as it changes."""

CAUGHT_BY = 'reduce-scatter: each rank gets its piece of the mean gradient, then adds'
HINT = "a .grad that is there already gets the new mean"
PATCH = [
    ('            s.param.grad = out if s.param.grad is None else s.param.grad.add_(out)\n',
     '            s.param.grad = out\n'),
]
