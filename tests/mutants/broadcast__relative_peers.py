"""Numbers the ranks from src (me = (rank - src) % p) but sends to me + 2^k and receives from
me - 2^k as if those were real ranks: with src != 0 the messages go to the wrong ranks (at
p = 2 with src = 1, rank 1 sends to itself). The peers must be converted back:
(rank + 2^k) % p and (rank - 2^k) % p."""
import torch.distributed as dist
from dist_sgd.comm.collectives import _check_rank, _check_tensor
from dist_sgd.plumbing.rank import world

CAUGHT_BY = "n = 1001 float32 numbers from src = p - 1"
HINT = "a rank sent to (or received from) itself"


def broadcast(tensor, src):
    _check_tensor(tensor, "tensor")
    rank, size = world("broadcast")
    _check_rank(src, "src", size)
    me = (rank - src) % size
    have = 1
    while have < size:
        if me < have and me + have < size:
            dist.send(tensor, me + have)
        elif have <= me < 2 * have:
            dist.recv(tensor, me - have)
        have *= 2
