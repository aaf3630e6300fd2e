"""Nesterov's direction from the buffer as it was before this step's update: g + mu * b_old.
torch updates the buffer first (b = mu * b + (1 - dampening) * g) and steps along
g + mu * b with the new one: the look-ahead includes this step's gradient."""
import torch
from dist_sgd.sgd.optim import _check


CAUGHT_BY = "Nesterov momentum 0.9, 4 steps"
HINT = "with nesterov=True the step is g + momentum *"


class SGD(torch.optim.Optimizer):
    """SGD with momentum, dampening, weight decay, Nesterov momentum and maximize.

    The same arguments and defaults as torch.optim.SGD. params: an iterable of parameters, or
    of dicts (parameter groups) that may override any option, e.g.
    [{"params": body.parameters()}, {"params": head.parameters(), "lr": 0.1}].
    lr may be a float or a 1-element tensor. foreach is accepted and changes nothing: ours is
    always the plain loop over parameters (torch's foreach path does the same arithmetic on
    lists of tensors at once). fused=True and differentiable=True are refused (UNSUPPORTED).
    """

    def __init__(self, params, lr=1e-3, momentum=0, dampening=0, weight_decay=0, nesterov=False,
                 *, maximize=False, foreach=None, differentiable=False, fused=None):
        defaults = {"lr": lr, "momentum": momentum, "dampening": dampening,
                    "weight_decay": weight_decay, "nesterov": nesterov, "maximize": maximize,
                    "foreach": foreach, "differentiable": differentiable, "fused": fused}
        _check(defaults)
        super().__init__(params, defaults)

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        _check(self.param_groups[-1])  # now with the defaults filled in: check the mix

    def load_state_dict(self, state_dict):
        # A state_dict from torch.optim.SGD may carry options ours does not implement:
        # refuse it rather than silently train differently.
        for group in state_dict["param_groups"]:
            _check({"maximize": False, "nesterov": False, **group})
        super().load_state_dict(state_dict)

    @torch.no_grad()  # the update is not part of the model's computation graph
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, mu, tau = group["lr"], group["momentum"], group["dampening"]
            weight_decay, nesterov = group["weight_decay"], group["nesterov"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = -p.grad if group["maximize"] else p.grad
                if weight_decay != 0:
                    g = g.add(p, alpha=weight_decay)
                if mu != 0:
                    state = self.state[p]
                    old = state.get("momentum_buffer")
                    if old is None:
                        state["momentum_buffer"] = g.clone()
                        old = state["momentum_buffer"]
                    else:
                        previous = old.clone()
                        old.mul_(mu).add_(g, alpha=1 - tau)
                        old = previous
                    g = g.add(old, alpha=mu) if nesterov else state["momentum_buffer"]
                p.add_(g, alpha=-lr)
        return loss
