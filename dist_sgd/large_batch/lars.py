"""LARS: layer-wise adaptive rate scaling (You, Gitman, Ginsburg 2017), a torch optimizer.

With a large batch and a large learning rate, one global rate is too big for some layers and
too small for others: the ratio |w| / |g| of a layer's weights to its gradient differs by
orders of magnitude between layers, and the layer whose update is large against its weights
diverges first. LARS gives each parameter tensor w its own "trust ratio"

    trust = trust_coefficient x |w| / (|g| + weight_decay x |w| + eps)   (1 if |w| or |g| is 0)

so that the step's size is a fixed fraction of |w|, whatever the gradient's scale. Algorithm 1
of the paper, per tensor, with momentum m and the global rate lr:

    v <- m v + lr x trust x (g + weight_decay x w)
    w <- w - v

Biases and norms, and the velocity that carries the learning rate: LARS's docstring.
"""
import torch

from dist_sgd.plumbing.mine import swap_in


class LARS(torch.optim.Optimizer):
    """Per tensor w with gradient g, options from the tensor's param group, velocity v in
    self.state[w]["velocity"] (zeros at first, carried from step to step):

        tensors with two or more dimensions (matrices, kernels):
            trust = trust_coefficient |w| / (|g| + weight_decay |w| + eps), or 1 where |w| or |g|
                    is 0 (a layer of zeros must still move)
            v <- momentum v + lr trust (g + weight_decay w);  w <- w - v
        tensors with one dimension: plain momentum SGD, no trust ratio and no weight decay:
            v <- momentum v + lr g;  w <- w - v
        a tensor whose .grad is None: no step, its velocity kept. p.grad is left as it is.

    Tensors with one dimension (biases, BatchNorm's weights) take no trust ratio and no weight
    decay, as is usual (their norms say little and decaying them only hurts).
    Unlike torch's SGD, the velocity carries the learning rate: when lr changes (warmup, decay),
    old velocity keeps the old rate, which is what the paper (and Goyal's momentum correction
    discussion) describe. torch has no LARS; this one takes torch's optimizer interface
    (param groups, state_dict, a closure).
    """
    def __init__(self, params, lr, momentum=0.9, weight_decay=0.0, trust_coefficient=0.001,
                 eps=1e-8):
        for name, value in (("lr", lr), ("momentum", momentum), ("weight_decay", weight_decay),
                            ("trust_coefficient", trust_coefficient), ("eps", eps)):
            if not value >= 0:
                raise ValueError(f"LARS: {name} must be >= 0, got {value!r}")
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay,
                                      trust_coefficient=trust_coefficient, eps=eps))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, m, wd = group["lr"], group["momentum"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue  # frozen or unused: no step, its velocity kept
                # ---- exercise LARS: one tensor's update (trust ratio, momentum, weight decay)
                g = p.grad
                if p.dim() > 1:  # a weight matrix or a convolution's kernel
                    w_norm, g_norm = p.norm(), g.norm()
                    trust = group["trust_coefficient"] * w_norm / (
                        g_norm + wd * w_norm + group["eps"])
                    trust = torch.where((w_norm > 0) & (g_norm > 0), trust, 1.0)
                    step = (g + wd * p) * (lr * trust)
                else:  # biases and norms: plain momentum SGD with the velocity carrying lr
                    step = g * lr
                state = self.state[p]
                if "velocity" not in state:
                    state["velocity"] = torch.zeros_like(p)
                v = state["velocity"].mul_(m).add_(step)
                p.sub_(v)
                # ---- end of exercise
        return loss


# DIST_SGD_MINE: a learner's version replaces this one
swap_in(globals(), "LARS", ("LARS",), lesson="18")
