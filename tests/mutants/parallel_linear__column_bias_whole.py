"""The column layer keeps the whole bias, as the row layer does: but each rank computes only
its slice of the outputs, out_features / p of them, and each output has its own bias. Rank r
holds bias.chunk(p)[r], the entries of its own outputs.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""

CAUGHT_BY = "from_linear: a column layer keeps its rows, a row layer its columns and the bias"
HINT = "each rank adds its slice of the bias to its slice"
PATCH = [
    ("        self.bias = nn.Parameter(torch.zeros(local, dtype=dtype, device=device))"
     " if bias else None\n",
     "        self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype, device=device))"
     " if bias else None\n"),
    ("                layer.bias.copy_(linear.bias.chunk(layer.size)[layer.rank])\n",
     "                layer.bias.copy_(linear.bias)\n"),
]
