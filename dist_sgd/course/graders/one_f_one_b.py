"""Lesson 19's one_f_one_b(stage_index, num_stages, n_microbatches): 1F1B's order of work on one
stage, and last_stage_loss(...): the loss the last stage runs backward from. Graded on the
order's rules at every stage, then in a real pipeline against one process."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from dist_sgd.course.grade import Grader
from dist_sgd.parallel import pipeline as P

grader = Grader("one_f_one_b", error_hints={
    "KeyError": "the pipeline looked up a micro-batch this stage holds no forward for: a backward "
                "ran before its forward (or twice); the order case names the first wrong step"})


def _make():
    torch.manual_seed(0)
    return nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(6, 6), nn.Tanh())]).double()


def _rules(s, p, m):
    """The one list the rules allow on stage s of p with m micro-batches."""
    w = min(p - 1 - s, m)
    pairs = [a for i in range(m - w) for a in (("F", w + i), ("B", i))]
    return [("F", i) for i in range(w)] + pairs + [("B", i) for i in range(m - w, m)]


def _why(step, k, s, p, m, forwards, backwards):
    """The hint for the first wrong step, read off what ran before it on stage s."""
    at, (kind, i) = f"stage {s}, step {k}: ", step
    if not 0 <= i < m:
        return at + f"{kind} {i}, but there are m = {m} micro-batches: the warm-up is " \
                    "min(p - 1 - s, m) forwards, never more than m"
    if kind == "B" and i not in forwards:
        return at + f"B {i} runs before F {i}: a micro-batch's backward needs its forward " \
                    "(on the last stage too: F i, then B i)"
    if kind == "B" and i != len(backwards):
        return at + f"B {i} where B {len(backwards)} is next: backwards run in the forwards' " \
                    "order, first in, first out (the drain at the end too)"
    if kind == "F" and i != len(forwards):
        return at + f"F {i} where F {len(forwards)} is next: forwards run in order"
    if kind == "F":
        return at + f"holding {len(forwards) - len(backwards) + 1} micro-batches, more than " \
                    f"p - s = {p - s}: the warm-up shrinks along the pipeline, p - 1 - s on stage s"
    return at + "a backward before the warm-up is done: stage s must run ahead of the later " \
                "stages by p - 1 - s forwards"


@grader.case("the order on every stage, step by step, m = 1, p and p + 3")
def order(ctx):
    """Every stage's list, step by step: micro-batch i's forward before its backward, forwards and
    backwards each in micro-batch order (the drain too), each once; min(p - 1 - s, m) warm-up
    forwards on stage s (never more than p - s held), then one forward and one backward in turn
    while forwards remain, then the backwards left. The first wrong step is named."""
    p = ctx.world_size
    for s in range(p):
        for m in sorted({1, p, p + 3}):
            got = ctx.call(ctx.impl.one_f_one_b, s, p, m)
            where = f"stage {s} of {p}, m = {m}"
            ctx.expect(isinstance(got, list) and all(
                isinstance(a, tuple) and len(a) == 2 and a[0] in ("F", "B") and
                isinstance(a[1], int) for a in got),
                f"{where}: got {got!r}, expected a list of (\"F\", i) and (\"B\", i)")
            expected, forwards, backwards = _rules(s, p, m), [], []
            for k, step in enumerate(got):
                if k >= len(expected) or step != expected[k]:
                    ctx.fail(f"{where}: step {k} is {step}, expected "
                             f"{expected[k] if k < len(expected) else 'the end'}",
                             [_why(step, k, s, p, m, forwards, backwards)])
                (forwards if step[0] == "F" else backwards).append(step[1])
            ctx.expect(len(got) == len(expected),
                       f"{where}: the list ends after {len(got)} steps, expected {len(expected)} "
                       f"(next: {expected[len(got):][:1]})",
                       [f"stage {s}: each micro-batch runs forward once and backward once"])


@grader.case("two steps of a 1F1B pipeline: gradients and weights of one process")
def pipeline(ctx):
    """The learner's order and last-stage loss inside a real 1F1B pipeline over send/recv: after two
    steps every stage's gradients and weights equal one process on the whole batch (float64)."""
    p, rank, m = ctx.world_size, ctx.rank, ctx.world_size + 1

    class Mine(P.Schedule1F1B):  # torch's interface, with the learner's order and loss
        order = staticmethod(ctx.impl.one_f_one_b)
        loss = staticmethod(ctx.impl.last_stage_loss)
    one, mod = _make(), P.split_stages(_make(), p)[rank]
    sched = Mine(P.PipelineStage(mod, rank, p, "cpu"), m, F.mse_loss)
    opts = [torch.optim.SGD(x.parameters(), lr=0.1) for x in (one, mod)]
    for step in range(2):
        g = torch.Generator().manual_seed(step)
        x, y = (torch.randn(2 * m, 6, generator=g, dtype=torch.float64) for _ in "xy")
        for opt in opts:
            opt.zero_grad()
        F.mse_loss(one(x), y).backward()
        ctx.call(sched.step, *([x] if rank == 0 else []), **({"target": y} if rank == p - 1
                                                              else {}))
        for (name, q), ref in zip(mod.named_parameters(), P.split_stages(one, p)[rank]
                                  .parameters()):
            hints = [f"the gradients are m = {m} times too small: the schedule already divides "
                     "them by the micro-batch count; the loss itself is loss_fn(output, target)"
                     ] if torch.allclose(q.grad * m, ref.grad) else []
            ctx.expect_close(q.grad, ref.grad, f"step {step}, stage {rank}'s {name}.grad",
                             atol=1e-12, rtol=1e-9, hints=hints)
        for opt in opts:
            opt.step()
    for (name, q), ref in zip(mod.named_parameters(), P.split_stages(one, p)[rank].parameters()):
        ctx.expect_close(q.detach(), ref.detach(), f"stage {rank}'s {name} after 2 steps",
                         atol=1e-12, rtol=1e-9)
