"""The row layer keeps its weight as the paper's B in Y = X B, shape (in / p, out), and takes
B's rows: the numbers are right, but the layer is no slice of nn.Linear's weight (out, in),
the layout torch's layers and checkpoints use. A row-parallel layer holds the columns of
nn.Linear's weight: chunk(p, dim=1).

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""

CAUGHT_BY = "from_linear: a column layer keeps its rows, a row layer its columns and the bias"
HINT = "a row-parallel layer splits the inputs: columns, chunk(p, dim=1)"
PATCH = [
    ("        self.weight = nn.Parameter(torch.empty(out_features, local, dtype=dtype,"
     " device=device))\n",
     "        self.weight = nn.Parameter(torch.empty(local, out_features, dtype=dtype,"
     " device=device))  # B\n"),
    ("        y = ReduceFromParallel.apply(F.linear(x, self.weight), self.group, self.log)\n",
     "        y = ReduceFromParallel.apply(x @ self.weight, self.group, self.log)\n"),
    ("            layer.weight.copy_(linear.weight.chunk(layer.size, dim=1)[layer.rank])\n",
     "            layer.weight.copy_(linear.weight.t().chunk(layer.size, dim=0)[layer.rank])\n"),
]
