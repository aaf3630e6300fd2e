"""A correct version written from the paper's formulas, with Python floats for the norms."""
import math

import torch


class LARS(torch.optim.Optimizer):
    def __init__(self, params, lr, momentum=0.9, weight_decay=0.0, trust_coefficient=0.001,
                 eps=1e-8):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay,
                                      trust_coefficient=trust_coefficient, eps=eps))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                lr, wd = group["lr"], group["weight_decay"]
                if p.dim() == 1:
                    update = lr * p.grad
                else:
                    wn, gn = math.sqrt(float((p * p).sum())), math.sqrt(float((p.grad ** 2).sum()))
                    trust = 1.0
                    if wn > 0 and gn > 0:
                        trust = group["trust_coefficient"] * wn / (gn + wd * wn + group["eps"])
                    update = lr * trust * (p.grad + wd * p)
                v = self.state[p].get("velocity")
                v = update if v is None else group["momentum"] * v + update
                self.state[p]["velocity"] = v
                p.sub_(v)
