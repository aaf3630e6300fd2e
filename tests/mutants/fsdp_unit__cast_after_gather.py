"""Gathers the pieces in the parameter's dtype (float32) and casts the full tensor to the
compute dtype afterwards: the values are right, but every number crossed the wire in 4
bytes, twice what float16 takes. Each piece is cast to self.dtypes[i] before it is sent.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""

CAUGHT_BY = "gather in float16: the pieces cast before they are sent"
HINT = "cast the piece to self.dtypes[i] before the all-gather: half the bytes"
PATCH = [
    ("            piece = s.param.detach().to(self.dtypes[i])  # cast"
     " first: float16 halves the bytes\n"
     "            work = self.comm.start(\"all_gather\", list(flat.split(s.size)), piece)\n",
     "            piece = s.param.detach()\n"
     "            full = piece.new_empty(numel)  # gathered in the parameter's dtype\n"
     "            work = self.comm.start(\"all_gather\", list(full.split(s.size)), piece)\n"
     "            work.wait()\n"
     "            flat.copy_(full)  # then cast to the compute dtype\n"),
]
