"""Broadcasts each parameter from its position in its owner's shard (the inner loop's index)
instead of from its owner (the outer loop's rank): a shard of more parameters than ranks names
a rank that does not exist, and the others come from a rank that never stepped them. src is
the rank that owns p, the one whose optimizer stepped it."""
CAUGHT_BY = "3 Adam steps: plain Adam's weights on one process, on every rank"
HINT = "broadcast(p, src=r): r is the rank that owns p"
PATCH = [("""        for r, s in enumerate(shards):
            for p in s:
                if self.comm is dist and p.is_contiguous():  # all in flight at once
                    works.append(dist.broadcast(p, src=r, async_op=True))""",
          """        for r, s in enumerate(shards):
            for i, p in enumerate(s):
                if self.comm is dist and p.is_contiguous():  # all in flight at once
                    works.append(dist.broadcast(p, src=i, async_op=True))""")]
