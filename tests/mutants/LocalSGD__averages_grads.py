"""average_parameters averages p.grad, as average_gradients does: but local SGD averages the
weights themselves, after the optimizer has stepped; a parameter fresh from its constructor
(or after zero_grad(set_to_none=True)) has no .grad at all."""
CAUGHT_BY = "average_parameters: every parameter becomes the ranks' mean, in place"
HINT = "average the parameters themselves (p.data or p under torch.no_grad())"
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
        dist.all_reduce(p.grad, group=group)
        p.grad /= world_size
""")]
