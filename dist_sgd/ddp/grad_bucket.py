"""GradBucket: one bucket as a communication hook sees it, in our DDP and outside any DDP.

It has the methods of torch's torch.distributed.GradBucket, so torch's own hooks
(allreduce_hook, fp16_compress_hook, powerSGD_hook) run on our DistributedDataParallel
unchanged, and ours (dist_sgd.ddp.compress) on plain tensors:

    bucket = GradBucket.of([p.grad for p in params])     # outside DDP: a flat copy
    averaged_flat = hook(state, bucket).wait()
"""
from dist_sgd.comm.flat import flatten, views


class GradBucket:
    """GradBucket(index, buffer, like, is_last, params=()).

    buffer(): the flat gradients of the bucket, one after the other (in DDP not yet divided by
    the world size: under a hook, dividing is the hook's job, as in torch); gradients(): views
    of buffer(), shaped like the tensors (or sizes) of `like`; set_buffer(t): replace the
    buffer (fp16_compress_wrapper sends a float16 copy); parameters(): the parameters whose
    gradients these are (none outside DDP); index(), is_last(): its place among the step's
    buckets (PowerSGD keeps its memory per index and counts steps at the last one).
    """

    def __init__(self, index, buffer, like, is_last, params=()):
        self._index, self._buffer, self._is_last = index, buffer, is_last
        self._like, self._params = list(like), list(params)

    @classmethod
    def of(cls, gradients, index=0, is_last=True):
        """A bucket outside DDP: the gradients copied, one after the other, into a new flat
        buffer. Once the hook's Future is done, its value is the averaged flat buffer."""
        gradients = list(gradients)
        return cls(index, flatten(gradients), [g.shape for g in gradients], is_last)

    def index(self):
        return self._index

    def is_last(self):
        return self._is_last

    def buffer(self):
        return self._buffer

    def set_buffer(self, tensor):
        self._buffer = tensor

    def parameters(self):
        return list(self._params)

    def gradients(self):
        return views(self._buffer, self._like)
