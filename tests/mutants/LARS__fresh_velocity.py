"""Creates the velocity afresh at every step: the first step is right, every later one has lost
the momentum.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""
CAUGHT_BY = "a matrix, a bias and a kernel: 4 steps, momentum 0.9, weight decay 5e-4"
HINT = "the velocity starts over at every step"
PATCH = [("""                if "velocity" not in state:""", """                if True:""")]
