"""Applies the trust ratio and weight decay to every tensor, biases too: a bias's norm says
nothing about the scale its step should have (and starts at 0)."""
PATCH = [("                if p.dim() > 1:  # a weight matrix or a convolution's kernel",
          "                if True:")]
CAUGHT_BY = "a matrix, a bias and a kernel: 4 steps, momentum 0.9, weight decay 5e-4"
HINT = "tensors with one dimension (biases, norms) take no trust"
