"""Starts the momentum buffer at zeros and updates it at once: b = (1 - dampening) * g on
the first step, where torch takes b = g (the same only without dampening)."""
import torch

CAUGHT_BY = "momentum 0.9 with dampening 0.5, 4 steps"
HINT = "on a parameter's first step the momentum buffer"


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
                d_p = p.grad if not group["maximize"] else -p.grad
                if weight_decay != 0:
                    d_p = d_p + weight_decay * p
                if momentum != 0:
                    state = self.state[p]
                    buf = state.setdefault("momentum_buffer", torch.zeros_like(p))
                    buf.mul_(momentum).add_(d_p, alpha=1 - dampening)
                    if group["nesterov"]:
                        d_p = d_p + momentum * buf
                    else:
                        d_p = buf
                p.sub_(lr * d_p)
        return loss
