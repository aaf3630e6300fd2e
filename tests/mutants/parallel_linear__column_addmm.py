"""The column layer as torch.addmm(bias, x, W^T): right for a (batch, width) x, a RuntimeError
for the (batch, sequence, width) activations of a transformer (addmm takes matrices only), and
for a layer without a bias.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""
CAUGHT_BY = "each layer alone on (batch, sequence, width) inputs, with a bias and without"
HINT = "x may have any number of leading dimensions"
PATCH = [("        y = F.linear(CopyToParallel.apply(x, self.group, self.log), self.weight, self.bias)\n",
          "        y = torch.addmm(self.bias, CopyToParallel.apply(x, self.group, self.log),\n"
          "                        self.weight.t())\n")]
