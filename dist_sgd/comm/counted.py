"""Collectives started asynchronously and counted: what a sharded wrapper sends, as issued.

Counted starts each collective asynchronously (torch's with async_op=True; ours on the one
ordered helper thread of dist_sgd.comm.ordered, which every wrapper shares so that every rank
issues its collectives in one order) and logs (name, bytes) of each: the bytes per step are
counted from what was issued, never computed from the model. FullyShardedDataParallel
(dist_sgd.shard.fsdp) gathers and reduces through it; the lessons count DDP's all-reduce too.
"""
import torch.distributed as dist

from dist_sgd.comm import collectives as ours
from dist_sgd.comm.ordered import start_all_reduce
from dist_sgd.shard.zero import wire_bytes

COLLECTIVES = {"torch": dist, "ours": ours}  # the same in-place signatures
_WHOLE = {"all_gather": 0, "reduce_scatter": 1, "all_reduce": 0}  # the argument with all data


class Counted:
    """Start collectives asynchronously, in the order asked, and log (name, bytes) of each."""

    def __init__(self, collectives="torch"):
        if collectives not in COLLECTIVES:
            raise ValueError(f"collectives must be one of {tuple(COLLECTIVES)}, "
                             f"got {collectives!r}")
        self.lib, self.log = COLLECTIVES[collectives], []

    def start(self, name, *args, count=True):
        """A handle with .wait(): torch's Work, or a Future from the ordered helper thread."""
        whole = args[_WHOLE[name]]
        if count:
            self.log.append((name, sum(t.numel() * t.element_size() for t in
                                       (whole if isinstance(whole, list) else [whole]))))
        fn = getattr(self.lib, name)
        if self.lib is dist:
            return fn(*args, async_op=True)
        # start_all_reduce runs any blocking function on the shared helper thread.
        return start_all_reduce(args[0], lambda _: fn(*args))

    def bytes_sent(self, world_size):
        """Bytes this rank sent for the logged collectives (each bandwidth-optimal)."""
        return sum(wire_bytes(name, n, world_size) for name, n in self.log)
