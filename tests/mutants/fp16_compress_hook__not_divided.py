"""The float16 copy is all-reduced but never divided by the world size: the sum of the
gradients, not their mean (p times too big)."""
import torch
import torch.distributed as dist


def fp16_compress_hook(process_group, bucket):
    group = process_group if process_group is not None else dist.group.WORLD
    buffer = bucket.buffer()
    half = buffer.to(torch.float16)
    fut = dist.all_reduce(half, group=group, async_op=True).get_future()

    def decompress(f):
        buffer.copy_(f.value()[0])
        return buffer

    return fut.then(decompress)


CAUGHT_BY = "3 steps on torch's DDP: torch's fp16_compress_hook's gradients, bit for bit"
HINT = ("divide the float16 copy by the world size, then",
        "times too big: summed but not divided")
