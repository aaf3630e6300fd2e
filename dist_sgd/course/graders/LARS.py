"""Lesson 18's LARS: each parameter tensor's update equal to a float64 transcription of the
paper's Algorithm 1 (trust ratio, weight decay inside it, the velocity carrying lr), biases
on plain momentum SGD; over several steps, lr changing, within 1e-12."""
import math

import torch

from dist_sgd.course.grade import Grader

grader = Grader("LARS")
ATOL, RTOL = 1e-14, 1e-12
HINTS = {
    "bias": "tensors with one dimension (biases, norms) take no trust ratio and no weight "
            "decay: v = momentum * v + lr * g",
    "trust": "trust = trust_coefficient * |w| / (|g| + weight_decay * |w| + eps), times "
             "(g + weight_decay * w), times lr",
    "zero": "where |w| or |g| is 0 the trust ratio is 1 (a layer of zeros must still move)",
    "velocity": "the velocity carries the learning rate: v = momentum * v + lr * trust * (...), "
                "then w = w - v (not w - lr * v)",
}


def _reference(weights, grads, lrs, momentum, wd, eta, eps=1e-8):
    ws = [w.clone() for w in weights]
    vs = [torch.zeros_like(w) for w in ws]
    for step, lr in enumerate(lrs):
        for i, w in enumerate(ws):
            g = grads[step][i]
            if w.dim() > 1:
                wn, gn = math.sqrt(float((w * w).sum())), math.sqrt(float((g * g).sum()))
                trust = eta * wn / (gn + wd * wn + eps) if wn > 0 and gn > 0 else 1.0
                vs[i] = momentum * vs[i] + lr * trust * (g + wd * w)
            else:
                vs[i] = momentum * vs[i] + lr * g
            ws[i] = w - vs[i]
    return ws


def _run(ctx, shapes, lrs, hints, momentum=0.9, wd=5e-4, eta=0.01, zero=(), zero_grad=()):
    gen = torch.Generator().manual_seed(len(shapes))
    weights = [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]
    for i in zero:
        weights[i].zero_()
    grads = [[torch.zeros(s, dtype=torch.float64) if (t, i) in zero_grad else
              torch.randn(s, generator=gen, dtype=torch.float64) * 10.0 ** (i - 1)
              for i, s in enumerate(shapes)] for t in range(len(lrs))]
    params = [torch.nn.Parameter(w.clone()) for w in weights]
    opt = ctx.call(ctx.impl.LARS, params, lrs[0], momentum=momentum, weight_decay=wd,
                   trust_coefficient=eta)
    for t, lr in enumerate(lrs):
        for group in opt.param_groups:
            group["lr"] = lr
        for p, g in zip(params, grads[t]):
            p.grad = g.clone()
        ctx.call(opt.step)
    expected = _reference(weights, grads, lrs, momentum, wd, eta)
    for i, (p, e) in enumerate(zip(params, expected)):
        ctx.expect_close(p.detach(), e, f"parameter {i} {tuple(shapes[i])} after {len(lrs)} "
                         "steps", atol=ATOL, rtol=RTOL,
                         hints=hints(shapes[i]) if callable(hints) else hints)


@grader.case("a matrix, a bias and a kernel: 4 steps, momentum 0.9, weight decay 5e-4")
def layers(ctx):
    """Four steps on a matrix, a bias and a 4-d kernel: each tensor equal to a float64 transcription
    of Algorithm 1 (trust ratio and weight decay on the matrices, plain momentum on the bias)."""
    # One lr throughout: where the velocity carries it cannot show here (changing_lr shows it);
    # the hint follows the tensor that went wrong.
    _run(ctx, [(4, 6), (6,), (3, 2, 2, 2)], [0.5] * 4,
         lambda shape: [HINTS["bias"] if len(shape) == 1 else HINTS["trust"]])


@grader.case("a layer of zeros and a zero gradient: trust ratio 1")
def zeros(ctx):
    """A layer of zeros and a zero gradient: the trust ratio is 1 there, not 0 or NaN."""
    _run(ctx, [(3, 3), (2, 5)], [0.3] * 3, [HINTS["zero"]], zero=(0,), zero_grad={(1, 1)})


@grader.case("lr warming up and decaying, one step each")
def changing_lr(ctx):
    """The rate changes every step: lr sits inside the velocity (v <- m v + lr trust g), as the
    paper writes it, not outside as torch's SGD keeps it."""
    _run(ctx, [(5, 3), (3,)], [0.1, 0.4, 0.8, 0.3, 0.05], [HINTS["velocity"]])
