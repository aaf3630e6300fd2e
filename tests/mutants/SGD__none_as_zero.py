"""Treats a missing gradient as zero: the parameter still decays and rolls on with its
momentum, where torch leaves it (and its buffer) alone."""
import torch

CAUGHT_BY = "a parameter whose .grad is None is skipped (weight decay and momentum on)"
HINT = "a parameter whose .grad is None is skipped: no"


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
                grad = p.grad if p.grad is not None else torch.zeros_like(p)
                d_p = grad if not group["maximize"] else -grad
                if weight_decay != 0:
                    d_p = d_p + weight_decay * p
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
