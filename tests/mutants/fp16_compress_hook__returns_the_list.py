"""Decompresses into the bucket, then hands back f.value() as it is: all_reduce's Future holds
a list of tensors (one here), but a communication hook's Future must hold the bucket's one
flat tensor, which DDP copies into the gradients.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""

CAUGHT_BY = "3 steps on torch's DDP: torch's fp16_compress_hook's gradients, bit for bit"
HINT = "the Future's value must be one tensor, the bucket's flat gradient"
PATCH = [
    ("        buffer.copy_(f.value()[0])  # in place: no second full-size buffer\n"
     "        return buffer\n",
     "        buffer.copy_(f.value()[0])\n"
     "        return f.value()\n"),
]
