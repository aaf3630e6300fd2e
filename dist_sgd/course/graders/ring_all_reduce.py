"""Lesson 04's ring_all_reduce(x): the sum over every rank, in place, from isend/irecv alone,
one chunk per message (about 2(p-1)/p of the tensor sent per rank), equal to torch's."""
import torch
import torch.distributed as dist

from dist_sgd.course.grade import COLLECTIVES, PAIRED_HANG_HINT, Grader, random_input

grader = Grader("ring_all_reduce", forbid=COLLECTIVES, hang_hint=PAIRED_HANG_HINT,
                error_hints={
    "out of range": "x.tensor_split(p) always gives p chunks (torch.chunk may give fewer)",
    "be contiguous": "send a chunk of x itself (a view), or .contiguous() a copy, then "
                     "copy the arrived values back into x",
    "must match the size of tensor": "each message must be one chunk on both sides: receive "
                                     "into a buffer the size of the chunk your left neighbour "
                                     "sends"})


def _input(rank, n, dtype):
    return random_input(1000 + rank, (n,), dtype)


def _sum_like_torch(ctx, n, dtype, atol):
    """ring_all_reduce(x) against dist.all_reduce on the same inputs, then every rank's bytes."""
    x = _input(ctx.rank, n, dtype)
    own, expected = x.clone(), x.clone()
    dist.all_reduce(expected)  # torch's sum (gloo), outside the piece
    ctx.call(ctx.impl.ring_all_reduce, x)  # in place: what it returns is not looked at
    ctx.expect_close(x, expected, "x after the call", atol=atol, rtol=atol, own=own)
    ctx.expect_same_on_every_rank(x, "x after the call", [
        "each chunk must be summed once, by one rank, then copied around unchanged"])


@grader.case("n = 10007 float32 numbers (p does not divide n)")
def uneven(ctx):
    """X in place equals dist.all_reduce's sum on the same inputs (within 1e-5), and every rank
    ends with the same bytes, when the chunks differ in size."""
    _sum_like_torch(ctx, 10007, torch.float32, 1e-5)


@grader.case("n = p + 1 float32 numbers (fewer than two per chunk)")
def tiny(ctx):
    """The same with one or two numbers per chunk: the chunk boundaries (tensor_split) hold at
    the smallest sizes."""
    _sum_like_torch(ctx, ctx.world_size + 1, torch.float32, 1e-5)


@grader.case("n = 1001 int64 numbers (the chunks keep x's dtype)")
def integers(ctx):
    """The same, exactly, for int64: the chunks and buffers keep x's dtype."""
    _sum_like_torch(ctx, 1001, torch.int64, 0)


@grader.case("bytes sent per rank for n = 40000 float32 numbers")
def bytes_sent(ctx):
    """Each rank sends at most 2(p-1) chunks of ceil(n/p) numbers (the ring's bandwidth), and
    sends something when p > 1."""
    n, p = 40000, ctx.world_size
    x = _input(ctx.rank, n, torch.float32)
    ctx.call(ctx.impl.ring_all_reduce, x)
    chunk = -(-n // p) * 4
    most = 2 * (p - 1) * chunk  # 2(p-1) messages of one chunk: about 2(p-1)/p of x
    ctx.expect(ctx.sent_bytes <= most,
               f"sent {ctx.sent_bytes:,} bytes, at most {most:,} expected "
               f"(2(p-1) = {2 * (p - 1)} messages of one chunk, {chunk:,} bytes)",
               ["send one chunk (about n/p numbers) per message, never the whole tensor: "
                f"the whole tensor around the ring is {2 * (p - 1) * n * 4:,} bytes"])
    ctx.expect(p == 1 or ctx.sent_bytes > 0, "sent nothing",
               ["every rank sends to its right neighbour, (rank + 1) % p"])
