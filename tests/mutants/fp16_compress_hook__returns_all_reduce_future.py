"""Returns all_reduce's own Future: its value is a list holding the float16 sum, never copied
back into the bucket nor turned back into its dtype. A hook's Future must hold one tensor, the
bucket's averaged flat gradient in its own dtype: fut.then(decompress).

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""

CAUGHT_BY = "3 steps on torch's DDP: torch's fp16_compress_hook's gradients, bit for bit"
HINT = "all_reduce's future holds a list: return its [0], decompressed"
PATCH = [
    ("    return fut.then(decompress)\n", "    return fut\n"),
]
