"""Lesson 06's SGD: each parameter's update equal to torch.optim.SGD's (its for-loop path,
foreach=False) over several steps: momentum 0 and 0.9, dampening, Nesterov, weight decay,
maximize, a parameter whose .grad is None, and p.grad left as it was. In float64 within
1e-12: the same formulas in another order round differently, a wrong formula is off by far
more (the library's own SGD matches torch bit for bit: tests/test_optim.py)."""
import torch

from dist_sgd.course.grade import Grader

grader = Grader("SGD", error_hints={
    "NoneType": "a parameter whose .grad is None gets no update: skip it (continue)",
    "KeyError: 'momentum_buffer'": "self.state[p] starts empty: a parameter's first step finds "
                                   "no \"momentum_buffer\" there; make it then, a copy of g "
                                   "(state.get(\"momentum_buffer\") is None the first time)"})
SHAPES = ((3, 5), (7,), (2, 1, 3))  # odd sizes
ATOL = RTOL = 1e-12
HINTS = {
    "buffer": "on a parameter's first step the momentum buffer is a copy of g (no dampening); "
              "after that b = momentum * b + (1 - dampening) * g, kept in self.state[p]",
    "decay": "weight decay comes first, before momentum: g = g + weight_decay * p",
    "nesterov": "with nesterov=True the step is g + momentum * b, not b",
    "maximize": "maximize negates the gradient first, then weight decay adds weight_decay * p",
    "skip": "a parameter whose .grad is None is skipped: no weight decay, no momentum, no step",
    "grad": "work on a new tensor (g = p.grad.add(p, alpha=weight_decay), b = g.clone()), "
            "never on p.grad itself, so the buffer does not share memory with p.grad",
}


def _gradient(step, i, shape):
    g = torch.Generator().manual_seed(100 * step + i)
    return torch.randn(shape, generator=g, dtype=torch.float64)


def _steps(ctx, steps, options, hints, none=(), groups=None):
    """Both optimizers over `steps` steps from the same weights and gradients; none: the
    (step, parameter) pairs with .grad None. Gradients are written into the existing .grad,
    as backward() does after zero_grad(set_to_none=False)."""
    torch.manual_seed(0)
    start = [torch.randn(shape, dtype=torch.float64) for shape in SHAPES]
    mine = [torch.nn.Parameter(w.clone()) for w in start]
    ref = [torch.nn.Parameter(w.clone()) for w in start]
    groups = groups or (lambda params: params)  # the params argument made from a list
    opt = ctx.call(ctx.impl.SGD, groups(mine), **options)
    ref_opt = torch.optim.SGD(groups(ref), foreach=False, **options)
    for step in range(steps):
        for i, (p, q) in enumerate(zip(mine, ref)):
            if (step, i) in none:
                p.grad = q.grad = None
                continue
            g = _gradient(step, i, p.shape)
            for param in (p, q):
                if param.grad is None:
                    param.grad = g.clone()
                else:
                    param.grad.copy_(g)
        ctx.call(opt.step)
        ref_opt.step()
        for i, p in enumerate(mine):
            if (step, i) not in none:
                ctx.expect(p.grad is not None and torch.equal(p.grad, _gradient(step, i, p.shape)),
                           f"parameter {i}: step {step} changed p.grad (torch's step leaves it)",
                           [HINTS["grad"]])
    for i, (p, q) in enumerate(zip(mine, ref)):
        ctx.expect_close(p.detach(), q.detach(), f"parameter {i} after {steps} steps",
                         atol=ATOL, rtol=RTOL, hints=hints)
    return opt, ref_opt, mine, ref


@grader.case("plain SGD (momentum 0), lr 0.1, 3 steps")
def plain(ctx):
    """After each step every parameter equals torch.optim.SGD's from the same weights and
    gradients (float64, within 1e-12), and p.grad is left as it was."""
    _steps(ctx, 3, {"lr": 0.1}, ["p = p - lr * p.grad, in place (p.add_(g, alpha=-lr))"])


@grader.case("momentum 0.9, 4 steps: the weights and the momentum buffers")
def momentum(ctx):
    """The same with momentum, and each parameter's momentum buffer equals torch's, kept in
    self.state[p]."""
    opt, ref_opt, mine, ref = _steps(ctx, 4, {"lr": 0.1, "momentum": 0.9}, [HINTS["buffer"]])
    for i, (p, q) in enumerate(zip(mine, ref)):
        b = opt.state[p].get("momentum_buffer")
        ctx.expect(b is not None, f"parameter {i}: no self.state[p][\"momentum_buffer\"]",
                   ["keep the buffer in self.state[p][\"momentum_buffer\"], as torch does: a "
                    "state_dict then loads into either optimizer"])
        ctx.expect_close(b, ref_opt.state[q]["momentum_buffer"], f"parameter {i}'s momentum "
                         "buffer after 4 steps", atol=ATOL, rtol=RTOL, hints=[HINTS["buffer"]])


@grader.case("momentum 0.9 with dampening 0.5, 4 steps")
def dampening(ctx):
    """The same with dampening: the first step's buffer is g itself, later ones damped."""
    _steps(ctx, 4, {"lr": 0.1, "momentum": 0.9, "dampening": 0.5}, [HINTS["buffer"]])


@grader.case("Nesterov momentum 0.9, 4 steps")
def nesterov(ctx):
    """The same with Nesterov momentum: the step is g + momentum * b."""
    _steps(ctx, 4, {"lr": 0.1, "momentum": 0.9, "nesterov": True}, [HINTS["nesterov"]])


@grader.case("weight decay 0.01 with momentum 0.9, 4 steps")
def weight_decay(ctx):
    """The same with weight decay, added to the gradient before momentum, p.grad untouched."""
    _steps(ctx, 4, {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01}, [HINTS["decay"]])


@grader.case("maximize=True with weight decay 0.01 and momentum 0.9, 3 steps")
def maximize(ctx):
    """The same with maximize=True: the gradient negated first, then weight decay."""
    _steps(ctx, 3, {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01, "maximize": True},
           [HINTS["maximize"]])


@grader.case("a parameter whose .grad is None is skipped (weight decay and momentum on)")
def skipped(ctx):
    """A parameter whose .grad is None at some step gets no weight decay, no momentum and no
    step then, as torch's."""
    # parameter 1 has no gradient at steps 1 and 2 (it has a buffer by then), parameter 2 none
    # at step 0 (its buffer starts at step 1)
    _steps(ctx, 4, {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01}, [HINTS["skip"]],
           none={(1, 1), (2, 1), (0, 2)})


@grader.case("two parameter groups, each with its own lr, momentum, maximize and decay")
def groups(ctx):
    """Two parameter groups, the second overriding lr, momentum, maximize, weight decay and
    Nesterov: each parameter stepped with its own group's options and its own momentum
    buffer, as torch's SGD."""
    def split(params):
        return [{"params": params[:1]},
                {"params": params[1:], "lr": 0.05, "momentum": 0.5, "maximize": True,
                 "weight_decay": 0.1, "nesterov": True}]
    _steps(ctx, 4, {"lr": 0.1, "momentum": 0.9}, [
        "every option comes from the parameter's group (group[\"maximize\"], ...), never from "
        "self.defaults: a group may override any of them",
        "the momentum buffer belongs to its parameter: self.state[p], keyed by the parameter "
        "itself (two groups both have a first parameter)"], groups=split)
