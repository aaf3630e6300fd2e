"""Adds the row layer's bias unconditionally: right for every layer with a bias, a TypeError
for one built with bias=False (self.bias is None).

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""
CAUGHT_BY = "each layer alone on (batch, sequence, width) inputs, with a bias and without"
HINT = "a layer built with bias=False has self.bias None"
PATCH = [("        return y if self.bias is None else y + self.bias\n",
          "        return y + self.bias\n")]
