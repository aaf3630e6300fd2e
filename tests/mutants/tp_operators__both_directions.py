"""g all-reduces in both directions ("a collective's backward is the same collective"): the
gradient of every partial sum comes out p times too big.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""

CAUGHT_BY = "g: the partial sums added forward, the gradient passed through backward"
HINT = "g's backward is the identity: each term of a sum"
PATCH = [
    ("    def backward(ctx, grad):\n        return grad, None, None\n",
     "    def backward(ctx, grad):\n        grad = grad.contiguous().clone()\n"
     "        all_reduce(grad)\n        return grad, None, None\n"),
]
