"""Lesson 12's fp16_compress_hook(process_group, bucket), registered on torch's DDP
(register_comm_hook): the gradients of torch's own fp16_compress_hook bit for bit, the bucket
all-reduced in float16 (half its bytes), the result handed back in the bucket's dtype."""
import torch
import torch.distributed as dist
import torch.distributed.algorithms.ddp_comm_hooks.default_hooks as torch_hooks
import torch.distributed.distributed_c10d as c10d
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from dist_sgd.course.grade import Grader

grader = Grader("fp16_compress_hook", error_hints={
    "NoneType": "process_group may be None: then use the default group (dist.group.WORLD)",
    # DDP's words for a Future holding a list: made by then(), or all_reduce's own
    "Unable to cast": "the Future's value must be one tensor, the bucket's flat gradient: "
                      "return fut.then(f -> the decompressed buffer), not the list f.value()",
    "hook result is a PyObject": "all_reduce's future holds a list: return its [0], "
                                 "decompressed"})
PER_RANK, STEPS = 5, 3


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(12, 9), nn.Linear(9, 7)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


def _train(hook, rank, bucket_cap_mb=25, steps=STEPS, dtype=torch.float32):
    """Every step's gradients of a DDP with `hook`, SGD steps in between."""
    torch.manual_seed(0)
    ddp = TorchDDP(Model().to(dtype), bucket_cap_mb=bucket_cap_mb)
    ddp.register_comm_hook(None, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    grads = []
    for step in range(steps):
        g = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(PER_RANK, 12, generator=g, dtype=dtype)
        y = torch.randn(PER_RANK, 7, generator=g, dtype=dtype)
        opt.zero_grad()
        F.mse_loss(ddp(x), y).backward()
        grads.append([p.grad.clone() for p in ddp.parameters()])
        opt.step()
    return grads


def _learners(ctx, seen=None):
    def hook(state, bucket):
        fut = ctx.call(ctx.impl.fp16_compress_hook, state, bucket)
        if seen is not None:
            seen.append((bucket.buffer().dtype, bucket.buffer().numel(), fut))
        return fut
    return hook


@grader.case("3 steps on torch's DDP: torch's fp16_compress_hook's gradients, bit for bit")
def like_torch(ctx):
    """As the hook of torch's DDP, three steps give the gradients torch's fp16_compress_hook
    gives, bit for bit, in one bucket and in many."""
    for cap in (25, 0.0002):  # one bucket; then a bucket per layer or so
        expected = _train(torch_hooks.fp16_compress_hook, ctx.rank, cap)
        got = _train(_learners(ctx), ctx.rank, cap)
        dist.barrier()
        names = [n for n, _ in Model().named_parameters()]
        for step, (mine, theirs) in enumerate(zip(got, expected)):
            for name, a, b in zip(names, mine, theirs):
                ctx.expect_close(a, b, f"step {step}, {'one bucket' if cap > 1 else 'buckets'}"
                                 f": {name}.grad", atol=0, hints=[
                                     "divide the float16 copy by the world size, then "
                                     "all-reduce it in float16: torch rounds at each step"])


@grader.case("what the hook all-reduces: float16, half the bucket's bytes")
def half_the_bytes(ctx):
    """What the hook all-reduces is float16: half the bucket's bytes on the wire."""
    sent = []
    original = dist.all_reduce

    def recording(tensor, *args, **kwargs):
        sent.append((tensor.dtype, tensor.numel()))
        return original(tensor, *args, **kwargs)

    seen = []
    dist.all_reduce = c10d.all_reduce = recording
    try:
        _train(_learners(ctx, seen), ctx.rank, steps=1)
    finally:
        dist.all_reduce = c10d.all_reduce = original
    dist.barrier()
    bucket_bytes = sum(n * dtype.itemsize for dtype, n, _ in seen)
    ctx.expect(ctx.calls.get("all_reduce", 0) >= 1 or ctx.world_size == 1 or sent,
               "the hook all-reduced nothing", ["all-reduce the float16 copy of the bucket"])
    if sent:  # what dist.all_reduce saw (a learner's import-time alias is not recorded)
        wide = [str(dtype) for dtype, _ in sent if dtype != torch.float16]
        ctx.expect(not wide, f"the hook all-reduced {', '.join(wide)} tensors, expected "
                   f"float16 only", ["cast to float16 before the all-reduce and back after it: "
                                     "the point is half the bytes on the wire"])
        got = sum(n * 2 for _, n in sent)
        ctx.expect(got * 2 == bucket_bytes, f"the hook all-reduced {got:,} bytes for buckets "
                   f"of {bucket_bytes:,}, expected {bucket_bytes // 2:,}")


@grader.case("the hook's result: the averaged bucket in its own dtype and shape")
def result_dtype(ctx):
    """The Future the hook returns holds the averaged bucket in the bucket's own dtype and
    shape."""
    seen = []
    _train(_learners(ctx, seen), ctx.rank, steps=1)
    _train(_learners(ctx, seen), ctx.rank, steps=1, dtype=torch.float64)  # a float64 model
    dist.barrier()
    for dtype, numel, fut in seen:
        value = fut.value()
        ctx.expect(isinstance(value, torch.Tensor), f"the hook's Future holds a "
                   f"{type(value).__name__}, expected a tensor",
                   ["all_reduce's future holds a list: return its [0], decompressed"])
        ctx.expect(value.dtype == dtype, f"the hook's Future holds a {value.dtype} tensor, "
                   f"expected the bucket's {dtype}",
                   ["decompress: copy the float16 sum back into bucket.buffer() (or .to(its "
                    "dtype)) and return that"])
        ctx.expect(value.numel() == numel, f"the hook's Future holds {value.numel()} values, "
                   f"expected the bucket's {numel}")
