"""f's backward all-reduces autograd's incoming gradient in place, with no clone: alone that
gives the right x.grad, but the tensor is the caller's v in y.backward(v), and with x used
twice, out = 3 x + f(x), the other use's gradient is computed from the summed one.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""
CAUGHT_BY = "f with x used twice: out = 3 x + f(x), x.grad and the caller's v"
HINT = "f's backward summed autograd's incoming gradient in place"
PATCH = [("        grad = grad.contiguous().clone()  # autograd's own tensor stays as it is\n", "")]
