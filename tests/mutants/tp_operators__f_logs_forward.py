"""f notes its all-reduce where f is applied, in forward, though its all-reduce runs in
backward: the log says f's message goes forward, and lesson 20's count per pass is wrong.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""
CAUGHT_BY = "the all-reduces noted in log: g's in forward, f's in backward"
HINT = "f noted an all-reduce in forward, where f sends nothing"
PATCH = [("        return x.view_as(x)\n",
          '        _log(log, x, "f", "forward")\n        return x.view_as(x)\n'),
         ('        _log(ctx.log, grad, "f", "backward")\n', "")]
