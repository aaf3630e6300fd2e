"""Zips a tuple's scattered elements with zip(..., strict=True), to be sure that no piece is
lost: but the pieces differ in number on purpose. Over 4 devices a tensor of 5 rows gives 3
chunks (torch's chunk), anything that is not a tensor gives 4 copies, and torch's scatter
zips them to the shortest: 3 replicas run."""
CAUGHT_BY = "scatter: 10, 5 and 3 rows over 4 devices, nested containers, as torch"
HINT = "zip() stops at the shortest on purpose"
PATCH = [("        return list(zip(*(scatter(x, devices, dim) for x in obj)))",
          "        return list(zip(*(scatter(x, devices, dim) for x in obj), strict=True))")]
