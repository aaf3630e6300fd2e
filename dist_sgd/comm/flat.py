"""Many tensors as one flat buffer, and back: one message instead of one per tensor.

    flat = flatten(grads)               # one 1-D tensor, the grads one after the other
    dist.all_reduce(flat)               # one start-up cost instead of len(grads)
    copy_back(flat, grads)              # each grad takes its slice again, in place

    for v, p in zip(views(flat, params), params): ...   # slices of flat shaped like each p

torch has `parameters_to_vector` / `vector_to_parameters` for the same idea, but the second
replaces each `param.data` (the tutorial-era `.data` we avoid): here writing back is a copy.
"""
import torch


def flatten(tensors, dtype=None, out=None):
    """The tensors' elements one after another in a new 1-D tensor (optionally cast), or
    written into the start of the 1-D tensor `out` (returned)."""
    tensors = list(tensors)
    if out is not None:
        with torch.no_grad():
            for v, t in zip(views(out, tensors), tensors):
                v.copy_(t)
        return out
    if not tensors:
        return torch.empty(0, dtype=dtype or torch.float32)  # on the CPU: no tensor, no device
    return torch.cat([t.detach().reshape(-1).to(dtype or t.dtype) for t in tensors])


def views(flat, like):
    """Slices of `flat`, one per tensor of `like`, shaped like it (they share flat's memory).

    An entry of `like` may be a tensor or a torch.Size."""
    shapes = [torch.Size(t.shape) if isinstance(t, torch.Tensor) else torch.Size(t) for t in like]
    pieces = flat[:sum(s.numel() for s in shapes)].split([s.numel() for s in shapes])
    return [piece.view(shape) for piece, shape in zip(pieces, shapes)]


@torch.no_grad()
def copy_back(flat, tensors, like=None):
    """flat's slices back into `tensors`, in place. A None in `tensors` (a parameter without
    a gradient) is skipped; `like` then gives the sizes (default: the tensors themselves)."""
    tensors = list(tensors)
    for t, v in zip(tensors, views(flat, like if like is not None else tensors)):
        if t is not None:
            t.copy_(v)
