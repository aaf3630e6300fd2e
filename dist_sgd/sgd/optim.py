"""Stochastic gradient descent, the update rule written out (step for step torch.optim.SGD).

For each parameter p with gradient g, learning rate lr, momentum mu, dampening tau,
weight decay lambda (the formulas of torch.optim.SGD's documentation):

    g = g + lambda * p                       if weight_decay != 0  (L2 penalty's gradient)
    if momentum != 0:
        b = g                                on the first step (no dampening yet)
        b = mu * b + (1 - tau) * g           on later steps
        g = g + mu * b  if nesterov  else  g = b
    p = p - lr * g

with maximize=True, g starts as -g (gradient ascent).
torch.optim.Optimizer does the bookkeeping only: parameter groups, the per-parameter state
dict, zero_grad(set_to_none=True), state_dict() / load_state_dict(). So a state_dict saved
here has torch's layout ({"momentum_buffer": tensor} per parameter) and loads into either.
"""
import numbers

import torch

from dist_sgd.plumbing.mine import swap_in


def _check(group):
    """Refuse a parameter group's bad options with torch.optim.SGD's rules and messages
    (a ValueError), and the options ours does not implement."""
    lr = group["lr"]
    if isinstance(lr, torch.Tensor) and lr.numel() != 1:
        raise ValueError("Tensor lr must be 1-element")
    if not isinstance(lr, (numbers.Real, torch.Tensor)) or lr < 0.0:
        raise ValueError(f"Invalid learning rate: {lr}")
    if group["momentum"] < 0.0:
        raise ValueError(f"Invalid momentum value: {group['momentum']}")
    if group["weight_decay"] < 0.0:
        raise ValueError(f"Invalid weight_decay value: {group['weight_decay']}")
    if group["nesterov"] and (group["momentum"] <= 0 or group["dampening"] != 0):
        raise ValueError("Nesterov momentum requires a momentum and zero dampening")
    for option in UNSUPPORTED:
        if group.get(option):
            raise ValueError(f"dist_sgd.sgd.optim.SGD does not implement {option}=True: "
                             f"{UNSUPPORTED[option]}")


# What torch.optim.SGD accepts and ours refuses, with the reason (README: "How ours differs").
UNSUPPORTED = {
    "fused": "a fused kernel is a speed path; use torch.optim.SGD(fused=True) for it",
    "differentiable": "ours updates under no_grad, so the step is not part of any graph; "
                      "use torch.optim.SGD(differentiable=True)",
}


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
                # ---- exercise SGD: update p from p.grad (momentum in self.state[p], torch's rules)
                if p.grad is None:
                    continue  # no gradient this step: p and its momentum stay as they are
                g = -p.grad if group.get("maximize") else p.grad  # ascend instead of descend
                if weight_decay != 0:
                    g = g.add(p, alpha=weight_decay)  # a new tensor: p.grad itself is kept
                if mu != 0:
                    state = self.state[p]
                    b = state.get("momentum_buffer")
                    if b is None:
                        b = state["momentum_buffer"] = g.detach().clone()
                    else:
                        b.mul_(mu).add_(g, alpha=1 - tau)
                    g = g.add(b, alpha=mu) if nesterov else b
                p.add_(g, alpha=-lr)
                # ---- end of exercise
        return loss


# DIST_SGD_MINE: a learner's version replaces ours
swap_in(globals(), "SGD", ("SGD",), lesson="06")
