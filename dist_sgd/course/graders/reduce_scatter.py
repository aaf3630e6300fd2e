"""Lesson 03's reduce_scatter(output, input_list): rank i's output is the sum over every rank
of input_list[i], from isend/irecv alone, each rank sending p-1 entries, the inputs
unchanged, equal to torch's (SUM)."""
import torch
import torch.distributed as dist

from dist_sgd.course.grade import COLLECTIVES, PAIRED_HANG_HINT, Grader

grader = Grader("reduce_scatter", forbid=COLLECTIVES, hang_hint=PAIRED_HANG_HINT,
                error_hints={
    "must match the size of tensor": "each message is one entry of the list: receive into a "
                                     "buffer shaped like output"})


def _inputs(rank, p, shape, dtype):
    g = torch.Generator().manual_seed(400 + rank)
    if dtype.is_floating_point:
        return [torch.randn(shape, generator=g, dtype=dtype) for _ in range(p)]
    return [torch.randint(-1000, 1000, shape, generator=g, dtype=dtype) for _ in range(p)]


def _like_torch(ctx, shape, dtype, atol):
    inputs = _inputs(ctx.rank, ctx.world_size, shape, dtype)
    kept = [t.clone() for t in inputs]
    expected, got = torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)
    dist.reduce_scatter(expected, [t.clone() for t in inputs])  # torch's, outside the piece
    ctx.call(ctx.impl.reduce_scatter, got, inputs)
    ctx.expect_close(got, expected, f"output (the sum of every rank's input_list[{ctx.rank}])",
                     atol=atol, rtol=atol, own=kept[ctx.rank], hints=[
                         "at step s send entry (r - s - 1) % p and add the arriving one into "
                         "entry (r - s - 2) % p: the last step completes entry r"])
    for i, (t, k) in enumerate(zip(inputs, kept)):
        ctx.expect_close(t, k, f"input_list[{i}] after the call", atol=0, hints=[
            "torch leaves input_list as it was: add into copies (t.clone()), not the inputs"])


@grader.case("entries of n = 5 float64 numbers")
def odd(ctx):
    """Output equals dist.reduce_scatter's (the sum of every rank's input_list[r], within
    1e-12), and input_list is left as it was."""
    _like_torch(ctx, (5,), torch.float64, 1e-12)


@grader.case("2 x 3 int64 entries (exact sums, shape and dtype kept)")
def integers(ctx):
    """The same, exactly, for int64 matrices: shape and dtype kept."""
    _like_torch(ctx, (2, 3), torch.int64, 0)


@grader.case("bytes sent per rank for entries of n = 10000 float32 numbers")
def bytes_sent(ctx):
    """Each entry (partly summed) travels once per step: p - 1 entries sent per rank at most,
    never the whole list."""
    n, p = 10000, ctx.world_size
    ctx.call(ctx.impl.reduce_scatter, torch.empty(n), _inputs(ctx.rank, p, (n,), torch.float32))
    most = (p - 1) * n * 4
    ctx.expect(ctx.sent_bytes <= most,
               f"sent {ctx.sent_bytes:,} bytes, at most {most:,} expected (p - 1 = {p - 1} "
               "entry(ies), one per message)",
               ["each entry (partly summed) travels once per step, never the whole list: "
                "rank j needs only entry j"])
