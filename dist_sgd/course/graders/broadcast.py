"""Lesson 03's broadcast(tensor, src): src's tensor on every rank, in place, from send/recv
alone, down a tree (no rank sends more than ceil(log2 p) copies), equal to torch's."""
import math

import torch
import torch.distributed as dist

from dist_sgd.course.grade import COLLECTIVES, PAIRED_HANG_HINT, Grader, random_input

grader = Grader("broadcast", forbid=COLLECTIVES, hang_hint=PAIRED_HANG_HINT)


def _input(rank, shape, dtype):
    return random_input(200 + rank, shape, dtype)


def _like_torch(ctx, shape, dtype, src):
    x = _input(ctx.rank, shape, dtype)
    own, expected = x.clone(), x.clone()
    dist.broadcast(expected, src)  # torch's, outside the piece
    ctx.call(ctx.impl.broadcast, x, src)  # in place
    # Rank 0's tensor on a rank other than 0: the tree was rooted at rank 0, not at src.
    from_zero = any(ctx.everyone(ctx.rank != 0 and torch.equal(x, _input(0, shape, dtype))))
    ctx.expect_close(x, expected, f"tensor after broadcast from src = {src}", atol=0,
                     own=own if ctx.rank != src else None, hints=[
                         "rank 0's tensor arrived, not src's: number the ranks from src, "
                         "(rank - src) % p, so that the tree starts at src" if from_zero else ""])


@grader.case("n = 1001 float32 numbers from src = p - 1")
def last_root(ctx):
    """Every rank's tensor, in place, equals dist.broadcast's from the last rank, bit for bit:
    the tree starts at src, not at rank 0."""
    _like_torch(ctx, (1001,), torch.float32, ctx.world_size - 1)


@grader.case("a 3 x 5 int64 tensor from src = 1 (src = 0 at p = 1)")
def middle_root(ctx):
    """The same for int64 from rank 1: the tensor keeps its shape and dtype."""
    _like_torch(ctx, (3, 5), torch.int64, 1 % ctx.world_size)


@grader.case("bytes sent per rank for n = 10000 float32 numbers from src = 0")
def bytes_sent(ctx):
    """A tree: no rank sends more than ceil(log2 p) copies of the tensor, and all together send
    p - 1 copies (each rank but src receives once)."""
    n, p = 10000, ctx.world_size
    ctx.call(ctx.impl.broadcast, _input(ctx.rank, (n,), torch.float32), 0)
    total = sum(ctx.everyone(ctx.sent_bytes))
    rounds = math.ceil(math.log2(p)) if p > 1 else 0
    most = rounds * n * 4
    ctx.expect(ctx.sent_bytes <= most,
               f"sent {ctx.sent_bytes:,} bytes, at most {most:,} expected (ceil(log2 p) = "
               f"{rounds} copies of the tensor)",
               ["a tree: every rank that has the tensor sends it on, so src sends ceil(log2 p) "
                "copies, not p - 1 (the others help)"])
    ctx.expect(total == (p - 1) * n * 4,
               f"all ranks together sent {total:,} bytes, expected {(p - 1) * n * 4:,} "
               f"(p - 1 = {p - 1} copies: each rank but src receives once)",
               ["each rank receives the tensor exactly once"])
