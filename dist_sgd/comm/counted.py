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

COLLECTIVES = {"torch": dist, "ours": ours}  # the same in-place signatures
_WHOLE = {"all_gather": 0, "reduce_scatter": 1, "all_reduce": 0}  # the argument with all data


def wire_bytes(collective, nbytes, world_size):
    """Bytes each rank sends, on average, in a bandwidth-optimal collective over nbytes.

    all_reduce (ring): 2(p-1)/p n. reduce_scatter and all_gather (n = all ranks' chunks
    together): (p-1)/p n. broadcast: every other rank must receive the n bytes once, (p-1) n
    on the wire in all, shared by p ranks: (p-1)/p n. Our collectives send exactly this much.
    """
    p = world_size
    factor = {"all_reduce": 2 * (p - 1) / p, "reduce_scatter": (p - 1) / p,
              "all_gather": (p - 1) / p, "broadcast": (p - 1) / p}[collective]
    return factor * nbytes


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
