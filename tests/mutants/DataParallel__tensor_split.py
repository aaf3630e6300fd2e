"""scatter cuts a tensor with tensor_split instead of chunk: 10 rows over 4 devices become
3 + 3 + 2 + 2 where torch (and torch.nn.DataParallel) gives 3 + 3 + 3 + 1.

Written as changes to the reference (dist_sgd/course/skeleton.reference): each (old, new)
replaces text that occurs once in it, so the wrong version follows the reference as it changes."""

CAUGHT_BY = 'scatter: 10, 5 and 3 rows over 4 devices, nested containers, as torch'
HINT = "torch's rule is tensor.chunk(p, dim): ceil(n /"
PATCH = [
    ('        return [c.to(d) for c, d in zip(obj.chunk(len(devices), dim), devices)]\n',
     '        return [c.to(d) for c, d in zip(obj.tensor_split(len(devices), dim), devices)]\n'),
]
