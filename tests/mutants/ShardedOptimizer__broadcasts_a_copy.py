"""Broadcasts p.clone() from its owner: the owner sends the right values, but on the other
ranks they arrive in a copy that is thrown away, and p keeps its stale value. Broadcast into
p itself (or copy the received values back into it).

Written as changes to the reference (dist_sgd/course/skeleton.reference): each (old, new)
replaces text that occurs once in it, so the wrong version follows the reference as it changes."""

CAUGHT_BY = "3 Adam steps: plain Adam's weights on one process, on every rank"
HINT = "after its own step, each parameter must reach"
PATCH = [
    ("                if self.comm is dist and p.is_contiguous():  # all in flight at once\n"
     "                    works.append(dist.broadcast(p, src=r, async_op=True))\n"
     "                else:\n"
     "                    flat = p.contiguous()  # p itself when contiguous\n"
     "                    self.comm.broadcast(flat, src=r)\n"
     "                    if flat is not p:\n"
     "                        p.copy_(flat)\n",
     "                self.comm.broadcast(p.clone(), src=r)\n"),
]
