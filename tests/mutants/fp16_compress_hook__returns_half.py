"""The Future's value is the float16 sum itself, never decompressed into the bucket's dtype."""
import torch
import torch.distributed as dist


def fp16_compress_hook(process_group, bucket):
    group = process_group if process_group is not None else dist.group.WORLD
    half = bucket.buffer().to(torch.float16).div_(group.size())
    fut = dist.all_reduce(half, group=group, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


CAUGHT_BY = "the hook's result: the averaged bucket in its own dtype and shape"
HINT = "decompress: copy the float16 sum back into"
