"""Divides each parameter in place, p /= world_size, with autograd watching: a parameter is a
leaf that requires grad, and autograd refuses an in-place change to it (it would corrupt the
graph). Averaging is no part of the model's computation: torch.no_grad(), or p.data."""
CAUGHT_BY = "average_parameters: every parameter becomes the ranks' mean, in place"
HINT = "change the parameters under torch.no_grad()"
PATCH = [("""    params = list(params)
    flat = flatten(params)
    world_size = world(group=group)[1]
    if world_size > 1:
        dist.all_reduce(flat, group=group)
        flat /= world_size
    copy_back(flat, params)
""",
          """    world_size = world(group=group)[1]
    for p in params:
        dist.all_reduce(p, group=group)
        p /= world_size
""")]
