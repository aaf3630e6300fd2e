"""Lesson 02's ring_sum(tensor): the sum of every rank's tensor, passed p-1 times around a ring
of send/recv, equal to torch's all_reduce, without a deadlock (gloo's blocking send waits
for its receiver, so every rank sending first hangs: a failed check, after the timeout)."""
import torch
import torch.distributed as dist

from dist_sgd.course.grade import BLOCKING_HANG_HINT, COLLECTIVES, Grader, random_input

grader = Grader("ring_sum", forbid=COLLECTIVES, hang_hint=BLOCKING_HANG_HINT,
                error_hints={
    "must match the size of tensor": "receive into a buffer the size of the tensor your left "
                                     "neighbour sends, and of its shape (torch.empty_like)"})


def _input(rank, shape, dtype):
    return random_input(100 + rank, shape, dtype)


def _sum_like_torch(ctx, shape, dtype, atol):
    x = _input(ctx.rank, shape, dtype)
    expected = x.clone()
    dist.all_reduce(expected)  # torch's sum (gloo), outside the piece
    got = ctx.call(ctx.impl.ring_sum, x.clone())
    ctx.expect(isinstance(got, torch.Tensor), f"ring_sum returned {type(got).__name__}, "
               "expected a tensor", ["return the total: a new tensor holding the sum"])
    ctx.expect_close(got, expected, "the returned sum", atol=atol, rtol=atol, own=x, hints=[
        "pass on exactly what arrived, in a buffer of its own: not your running total (it "
        "counts ranks twice), nor a buffer overwritten by a receive before it was sent"])


@grader.case("a 3 x 5 float32 tensor: the sum against dist.all_reduce")
def matrix(ctx):
    """The returned tensor equals dist.all_reduce's sum of every rank's 3 x 5 tensor (within
    1e-5), with no torch collective inside ring_sum."""
    _sum_like_torch(ctx, (3, 5), torch.float32, 1e-5)


@grader.case("131072 int64 numbers (1 MiB a message: too big for any send to be buffered)")
def big(ctx):
    """The same, exactly, for 1 MiB messages, which gloo cannot buffer: a blocking send waits
    for its receive, so the order of sends and receives must not deadlock."""
    _sum_like_torch(ctx, (1 << 17,), torch.int64, 0)
