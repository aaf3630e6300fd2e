"""Negates for maximize at the end, after weight decay: the decay then pushes the weights
away from zero instead of towards it."""
import torch

CAUGHT_BY = "maximize=True with weight decay 0.01 and momentum 0.9, 3 steps"
HINT = "maximize negates the gradient first, then"


class SGD(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3, momentum=0, dampening=0, weight_decay=0, nesterov=False,
                 *, maximize=False, foreach=None, differentiable=False, fused=None):
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening,
                        weight_decay=weight_decay, nesterov=nesterov, maximize=maximize)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, momentum = group["lr"], group["momentum"]
            dampening, weight_decay = group["dampening"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                d_p = p.grad
                if weight_decay != 0:
                    d_p = d_p + weight_decay * p
                if group["maximize"]:
                    d_p = -d_p
                if momentum != 0:
                    state = self.state[p]
                    if "momentum_buffer" not in state:
                        buf = torch.clone(d_p).detach()
                        state["momentum_buffer"] = buf
                    else:
                        buf = state["momentum_buffer"]
                        buf.mul_(momentum).add_(d_p, alpha=1 - dampening)
                    if group["nesterov"]:
                        d_p = d_p + momentum * buf
                    else:
                        d_p = buf
                p.sub_(lr * d_p)
        return loss
