"""Reads every parameter's .grad without asking whether it is None: a parameter that got no
gradient this step (frozen, unused in this forward pass, or zero_grad(set_to_none=True) with no
backward through it) has .grad None, and torch's SGD skips it. Skip it: `continue`."""
CAUGHT_BY = "a parameter whose .grad is None is skipped (weight decay and momentum on)"
HINT = "a parameter whose .grad is None gets no update: skip it (continue)"
PATCH = [("""                if p.grad is None:
                    continue  # no gradient this step: p and its momentum stay as they are
""", "")]
