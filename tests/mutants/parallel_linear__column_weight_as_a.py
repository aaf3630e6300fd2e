"""The column layer keeps its weight as the paper's A in Y = X A, shape (in, out / p), and
takes A's columns: the numbers are right, but the layer is no slice of nn.Linear's weight
(out, in), the layout every other piece (a checkpoint, a gradient check, torch's own layers)
expects. A column-parallel layer holds the rows of nn.Linear's weight: chunk(p, dim=0).

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""

CAUGHT_BY = "from_linear: a column layer keeps its rows, a row layer its columns and the bias"
HINT = "a column-parallel layer splits the outputs: rows of nn.Linear's (out, in) weight"
PATCH = [
    ("        self.weight = nn.Parameter(torch.empty(local, in_features, dtype=dtype,"
     " device=device))\n",
     "        self.weight = nn.Parameter(torch.empty(in_features, local, dtype=dtype,"
     " device=device))  # A\n"),
    ("        y = F.linear(CopyToParallel.apply(x, self.group, self.log),"
     " self.weight, self.bias)\n",
     "        y = CopyToParallel.apply(x, self.group, self.log) @ self.weight + self.bias\n"),
    ("            layer.weight.copy_(linear.weight.chunk(layer.size, dim=0)[layer.rank])\n",
     "            layer.weight.copy_(linear.weight.t().chunk(layer.size, dim=1)[layer.rank])\n"),
]
