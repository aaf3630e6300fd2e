"""Decompresses with .float(): float32 whatever the bucket's dtype, so a float64 model's
bucket comes back as float32 (DDP expects the bucket's own dtype and shape). Back into the
bucket's dtype: buffer.copy_(sum), or .to(buffer.dtype)."""
import torch
import torch.distributed as dist
from dist_sgd.ddp.compress import _group


CAUGHT_BY = "the hook's result: the averaged bucket in its own dtype and shape"
HINT = "decompress: copy the float16 sum back into"


def fp16_compress_hook(process_group, bucket):
    """Average the bucket in float16: half the bytes on the wire, then back to its dtype."""
    group = _group(process_group)
    buffer = bucket.buffer()
    half = buffer.to(torch.float16).div_(dist.get_world_size(group))
    fut = dist.all_reduce(half, group=group, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0].float())
