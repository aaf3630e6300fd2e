"""Lesson 18's LARS: each parameter tensor's update equal to a float64 transcription of the
paper's Algorithm 1 (trust ratio, weight decay inside it, the velocity carrying lr), biases
on plain momentum SGD; over several steps, lr changing, within 1e-12; each param group with
its own options, a parameter without a gradient left alone. A wrong tensor's hint comes from
the wrong formula it matches (each one below computed on the same inputs), not from the case."""
import math

import torch

from dist_sgd.course.grade import Grader

grader = Grader("LARS")
ATOL, RTOL = 1e-14, 1e-12
HINTS = {
    "bias": "tensors with one dimension (biases, norms) take no trust ratio and no weight "
            "decay: v = momentum * v + lr * g",
    "bias_decay": "a tensor with one dimension took weight decay: biases and norms take plain "
                  "momentum SGD, v = momentum * v + lr * g, with no weight_decay term",
    "denominator": "trust = trust_coefficient * |w| / (|g| + weight_decay * |w| + eps), times "
                   "(g + weight_decay * w), times lr",
    "sum_norm": "the trust ratio divides by |g| + weight_decay * |w|, two norms added, not by the "
                "norm of the sum |g + weight_decay * w|",
    "decay_outside": "weight decay went outside the trust ratio: the whole step is scaled, "
                     "v = momentum * v + lr * trust * (g + weight_decay * w)",
    "zero": "where |w| or |g| is 0 the trust ratio is 1 (a layer of zeros must still move)",
    "velocity": "the velocity carries the learning rate: v = momentum * v + lr * trust * (...), "
                "then w = w - v (not w - lr * v)",
    "groups": "each param group has its own trust_coefficient (and lr, momentum, weight_decay, "
              "eps): read it from the tensor's group, not from self.defaults or __init__",
    "fresh": "the velocity starts over at every step: keep it in self.state[p]['velocity'], "
             "created once (zeros) and carried from step to step",
    "no_grad": "a parameter whose .grad is None takes no step: skip it (its velocity kept for "
               "the next step it has a gradient)",
}
WRONG = tuple(HINTS)  # each a formula _reference can compute in place of the right one


def _reference(weights, grads, lrs, opts, wrong=None):
    """Algorithm 1 in float64, per tensor: opts[i] = (momentum, wd, eta) of its group (lr
    scaled by its group's factor), or the wrong formula named by `wrong`."""
    ws, vs, eps = [w.clone() for w in weights], [torch.zeros_like(w) for w in weights], 1e-8
    for step, lr in enumerate(lrs):
        for i, w in enumerate(ws):
            momentum, wd, eta, scale = opts[i]
            eta, momentum = opts[0][2] if wrong == "groups" else eta, \
                0.0 if wrong == "fresh" else momentum
            g, lr_i = grads[step][i], lr * scale
            if g is None and wrong != "no_grad":
                continue
            g = torch.zeros_like(w) if g is None else g
            if w.dim() > 1 or wrong == "bias":
                wn, gn = math.sqrt(float((w * w).sum())), math.sqrt(float((g * g).sum()))
                norm = {"sum_norm": float((g + wd * w).norm()),
                        "denominator": gn}.get(wrong, gn + wd * wn)
                trust = eta * wn / (norm + eps) if (wn > 0 and gn > 0) or wrong == "zero" \
                    else 1.0
                step_ = trust * g + wd * w if wrong == "decay_outside" else trust * (g + wd * w)
            else:
                step_ = g + wd * w if wrong == "bias_decay" else g
            vs[i] = momentum * vs[i] + (step_ if wrong == "velocity" else lr_i * step_)
            ws[i] = w - (lr_i * vs[i] if wrong == "velocity" else vs[i])
    return ws


def _run(ctx, shapes, lrs, momentum=0.9, wd=5e-4, eta=0.01, zero=(), zero_grad=(), groups=None,
         no_grad=()):
    """shapes' tensors stepped by the learner's LARS (lr set on every group before each step)
    and by _reference; groups: [(indices, options, lr factor)] after the first group's (the
    constructor's); no_grad: (step, index) pairs where .grad is None."""
    gen = torch.Generator().manual_seed(len(shapes))
    weights = [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]
    for i in zero:
        weights[i].zero_()
    grads = [[None if (t, i) in no_grad else torch.zeros(s, dtype=torch.float64)
              if (t, i) in zero_grad else torch.randn(s, generator=gen, dtype=torch.float64)
              * 10.0 ** (i % 3 - 1) for i, s in enumerate(shapes)] for t in range(len(lrs))]
    params = [torch.nn.Parameter(w.clone()) for w in weights]
    opts = [(momentum, wd, eta, 1.0)] * len(shapes)
    later = [i for indices, _, _ in groups or () for i in indices]
    opt = ctx.call(ctx.impl.LARS, [p for i, p in enumerate(params) if i not in later], lrs[0],
                   momentum=momentum, weight_decay=wd, trust_coefficient=eta)
    for indices, options, scale in groups or ():
        ctx.call(opt.add_param_group, dict(options, params=[params[i] for i in indices],
                                           lr=lrs[0] * scale))
        for i in indices:
            opts[i] = (options["momentum"], options["weight_decay"],
                       options["trust_coefficient"], scale)
    for t, lr in enumerate(lrs):
        for group, scale in zip(opt.param_groups, [1.0] + [s for _, _, s in groups or ()]):
            group["lr"] = lr * scale
        for p, g in zip(params, grads[t]):
            p.grad = None if g is None else g.clone()
        ctx.call(opt.step)
        changed = [i for i, (p, g) in enumerate(zip(params, grads[t]))
                   if g is not None and not torch.equal(p.grad, g)]
        ctx.expect(not changed, f"step {t}: parameter {changed[:1]}'s .grad changed in step()",
                   ["step() leaves p.grad as it is (the caller's, and accumulated into): an "
                    "in-place add_ on g writes into it; compute g + weight_decay * w into a new "
                    "tensor"])
    expected = _reference(weights, grads, lrs, opts)
    for i, (p, e) in enumerate(zip(params, expected)):
        got = p.detach()
        if torch.allclose(got, e, rtol=RTOL, atol=ATOL):
            continue
        fits = [HINTS[w] for w in WRONG if _fits(got, e, _reference(weights, grads, lrs, opts,
                                                                       w)[i])]
        ctx.expect_close(got, e, f"parameter {i} {tuple(shapes[i])} after {len(lrs)} steps",
                         atol=ATOL, rtol=RTOL, hints=fits or [
                             "compare this tensor's update with Algorithm 1 as LARS's docstring "
                             "writes it, step by step"])


def _fits(got, expected, wrong):
    """got is the wrong formula's result, and that formula differs from the right one here."""
    return not torch.allclose(wrong, expected, rtol=1e-9, atol=1e-12) and \
        torch.allclose(got, wrong, rtol=1e-9, atol=1e-12)


@grader.case("a matrix, a bias and a kernel: 4 steps, momentum 0.9, weight decay 5e-4")
def layers(ctx):
    """Four steps on a matrix, a bias and a 4-d kernel: each tensor equal to a float64 transcription
    of Algorithm 1 (trust ratio and weight decay on the matrices, plain momentum on the bias)."""
    # One lr throughout: where the velocity carries it cannot show here (changing_lr shows it).
    _run(ctx, [(4, 6), (6,), (3, 2, 2, 2)], [0.5] * 4)


@grader.case("a layer of zeros and a zero gradient: trust ratio 1")
def zeros(ctx):
    """A layer of zeros and a zero gradient: the trust ratio is 1 there, not 0 or NaN."""
    _run(ctx, [(3, 3), (2, 5)], [0.3] * 3, zero=(0,), zero_grad={(1, 1)})


@grader.case("lr warming up and decaying, one step each")
def changing_lr(ctx):
    """The rate changes every step: lr sits inside the velocity (v <- m v + lr trust g), as the
    paper writes it, not outside as torch's SGD keeps it."""
    _run(ctx, [(5, 3), (3,)], [0.1, 0.4, 0.8, 0.3, 0.05])


@grader.case("two param groups with their own options; a parameter with no gradient")
def groups(ctx):
    """A second param group (added with add_param_group) with its own lr, momentum, weight decay
    and trust coefficient steps by its own; a parameter whose .grad is None at step 2 does not
    move then, and its velocity carries on at step 3."""
    _run(ctx, [(4, 3), (3,), (2, 6), (6,)], [0.2, 0.5, 0.3, 0.1], no_grad={(1, 0), (1, 1)},
         groups=[((2, 3), dict(momentum=0.5, weight_decay=0.02, trust_coefficient=0.05), 0.4)])
