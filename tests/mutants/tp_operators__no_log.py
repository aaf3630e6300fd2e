"""f and g all-reduce right but never note it in log: every gradient is right, and lesson 20's
report, which counts the all-reduces per pass, finds none.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""
CAUGHT_BY = "the all-reduces noted in log: g's in forward, f's in backward"
HINT = "call _log(log, tensor, op, pass_) once after each all-reduce"
PATCH = [('        _log(ctx.log, grad, "f", "backward")\n', ""),
         ('        _log(log, x, "g", "forward")\n', "")]
