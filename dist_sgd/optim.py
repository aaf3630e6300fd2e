"""Stochastic gradient descent, the update rule written out (step for step torch.optim.SGD).

For each parameter p with gradient g, learning rate lr, momentum mu, dampening tau,
weight decay lambda (the formulas of torch.optim.SGD's documentation):

    g = g + lambda * p                       if weight_decay != 0  (L2 penalty's gradient)
    if momentum != 0:
        b = g                                on the first step (no dampening yet)
        b = mu * b + (1 - tau) * g           on later steps
        g = g + mu * b  if nesterov  else  g = b
    p = p - lr * g

torch.optim.Optimizer does the bookkeeping only: parameter groups, the per-parameter state
dict, zero_grad(set_to_none=True), state_dict() / load_state_dict(). So a state_dict saved
here has torch's layout ({"momentum_buffer": tensor} per parameter) and loads into either.
"""
import numbers

import torch


def _check(lr, momentum, dampening, weight_decay, nesterov):
    # The same rules and messages as torch.optim.SGD.
    if not isinstance(lr, numbers.Real) or lr < 0.0:
        raise ValueError(f"Invalid learning rate: {lr}")
    if momentum < 0.0:
        raise ValueError(f"Invalid momentum value: {momentum}")
    if weight_decay < 0.0:
        raise ValueError(f"Invalid weight_decay value: {weight_decay}")
    if nesterov and (momentum <= 0 or dampening != 0):
        raise ValueError("Nesterov momentum requires a momentum and zero dampening")


class SGD(torch.optim.Optimizer):
    """SGD with momentum, dampening, weight decay and Nesterov momentum.

    params: an iterable of parameters, or of dicts (parameter groups) that may override any
    of the options, e.g. [{"params": body.parameters()}, {"params": head.parameters(), "lr": 0.1}].
    """

    def __init__(self, params, lr, momentum=0, dampening=0, weight_decay=0, nesterov=False):
        _check(lr, momentum, dampening, weight_decay, nesterov)
        defaults = {"lr": lr, "momentum": momentum, "dampening": dampening,
                    "weight_decay": weight_decay, "nesterov": nesterov}
        super().__init__(params, defaults)

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        group = self.param_groups[-1]  # now with the defaults filled in: check the mix
        _check(group["lr"], group["momentum"], group["dampening"], group["weight_decay"],
               group["nesterov"])

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
                    continue  # no gradient this step: p and its momentum stay as they are
                g = p.grad
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
        return loss
