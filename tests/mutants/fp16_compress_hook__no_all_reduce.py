"""Compresses, divides and decompresses, but never all-reduces: the hook hands back a Future
already holding this rank's own gradient divided by p (a scaffold left without its
communication). Each rank then steps with a p-th of its own gradient; the ranks' buckets must
be summed, in float16.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""

CAUGHT_BY = "what the hook all-reduces: float16, half the bucket's bytes"
HINT = "all-reduce the float16 copy of the bucket"
PATCH = [
    ("    fut = dist.all_reduce(half, group=group, async_op=True).get_future()\n",
     "    fut = torch.futures.Future()\n"
     "    fut.set_result([half])  # the all-reduce goes here\n"),
]
