"""Lesson 03's all_gather(tensor_list, tensor): rank i's tensor in everyone's tensor_list[i],
from isend/irecv alone, each rank sending p-1 tensors (a ring), equal to torch's."""
import torch
import torch.distributed as dist

from dist_sgd.course.grade import COLLECTIVES, PAIRED_HANG_HINT, Grader, random_input

grader = Grader("all_gather", forbid=COLLECTIVES, hang_hint=PAIRED_HANG_HINT)


def _input(rank, shape, dtype):
    return random_input(300 + rank, shape, dtype)


def _like_torch(ctx, shape, dtype):
    p, x = ctx.world_size, _input(ctx.rank, shape, dtype)
    fill = float("nan") if dtype.is_floating_point else -12345  # an entry never written shows
    expected = [torch.full(shape, fill, dtype=dtype) for _ in range(p)]
    got = [torch.full(shape, fill, dtype=dtype) for _ in range(p)]
    dist.all_gather(expected, x)  # torch's, outside the piece
    ctx.call(ctx.impl.all_gather, got, x.clone())
    for i in range(p):
        ctx.expect_close(got[i], expected[i], f"tensor_list[{i}] (rank {i}'s tensor)", atol=0,
                         hints=["entry r on rank r is your own tensor: copy it in first"
                                if i == ctx.rank else
                                "at step s the tensor arriving from the left is rank "
                                "(r - s - 1) % p's: receive it into that entry"])


@grader.case("n = 7 float32 numbers per rank")
def odd(ctx):
    """Tensor_list holds every rank's tensor in rank order, bit for bit as dist.all_gather's,
    this rank's own entry included."""
    _like_torch(ctx, (7,), torch.float32)


@grader.case("a 2 x 3 int64 tensor per rank (entries keep shape and dtype)")
def integers(ctx):
    """The same for int64 matrices: the entries keep shape and dtype."""
    _like_torch(ctx, (2, 3), torch.int64)


@grader.case("bytes sent per rank for n = 10000 float32 numbers")
def bytes_sent(ctx):
    """Each rank sends its tensor's worth p - 1 times at most (one tensor per message, no rank
    gathering for everyone)."""
    n, p = 10000, ctx.world_size
    ctx.call(ctx.impl.all_gather, [torch.empty(n) for _ in range(p)],
             _input(ctx.rank, (n,), torch.float32))
    most = (p - 1) * n * 4
    ctx.expect(ctx.sent_bytes <= most,
               f"sent {ctx.sent_bytes:,} bytes, at most {most:,} expected (p - 1 = {p - 1} "
               "tensor(s): every other rank needs yours once)",
               ["send one tensor per message, never the whole list, and let the others pass "
                "it on (a ring) or send it to each yourself: no rank gathers for everyone"])
