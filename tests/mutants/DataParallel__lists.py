"""gather rebuilds every tuple as a list (and a namedtuple as a plain list): the caller
unpacks it the same, but torch returns the container it was given.

Written as changes to the reference (dist_sgd/course/skeleton.reference): each (old, new)
replaces text that occurs once in it, so the wrong version follows the reference as it changes."""

CAUGHT_BY = 'gather: tuples, dicts, None, namedtuples and one loss per replica, as torch'
HINT = "rebuild each container as its own type:"
PATCH = [
    ('        return type(first)._make(gather(list(xs), device, dim) for xs in zip(*outputs, strict=True))\n',
     '        return [gather(list(xs), device, dim) for xs in zip(*outputs, strict=True)]\n'),
    ('        return type(first)(gather(list(xs), device, dim) for xs in zip(*outputs, strict=True))\n',
     '        return [gather(list(xs), device, dim) for xs in zip(*outputs, strict=True)]\n'),
]
