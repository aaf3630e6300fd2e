"""Lesson 19's one_f_one_b(stage_index, num_stages, n_microbatches): 1F1B's order of work on one
stage, and last_stage_loss(...): the loss the last stage runs backward from. Graded on the
order's rules at every stage, then in a real pipeline against one process."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from dist_sgd.course.grade import Grader
from dist_sgd.parallel import pipeline as P

grader = Grader("one_f_one_b")


def _make():
    torch.manual_seed(0)
    return nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(6, 6), nn.Tanh())]).double()


@grader.case("the order on every stage, m = p and m = p + 3")
def order(ctx):
    """Every stage's list: each micro-batch forward once and backward once, in order; p - 1 - s
    warm-up forwards on stage s (never more held than p - s); then one forward, one backward."""
    p = ctx.world_size
    for s in range(p):
        for m in (p, p + 3):
            got = ctx.call(ctx.impl.one_f_one_b, s, p, m)
            where = f"stage {s} of {p}, m = {m}"
            ctx.expect(isinstance(got, list) and all(isinstance(a, tuple) and len(a) == 2 and
                                                     a[0] in "FB" for a in got),
                       f"{where}: got {got!r}, expected a list of (\"F\", i) and (\"B\", i)")
            fs, bs = [i for k, i in got if k == "F"], [i for k, i in got if k == "B"]
            ctx.expect(fs == list(range(m)) and bs == list(range(m)),
                       f"{where}: forwards {fs}, backwards {bs}; expected 0..{m - 1} each once, "
                       "in order")
            held, peak = 0, 0
            for kind, _ in got:
                held += 1 if kind == "F" else -1
                peak = max(peak, held)
            before = [k for k, _ in got].index("B")
            ctx.expect(before == min(p - s, m),
                       f"{where}: {before} forwards before the first backward, expected "
                       f"{min(p - s, m)} (p - 1 - s warm-ups, then one)",
                       [f"holding {peak} micro-batches, more than p - s = {p - s}: the warm-up "
                        "shrinks along the pipeline, p - 1 - s on stage s"] if peak > p - s
                       else ["stage s must run ahead of the later stages by p - 1 - s forwards"])
            steady = got[before - 1:2 * m - (before - 1)]
            ctx.expect([k for k, _ in steady] == ["F", "B"] * (len(steady) // 2),
                       f"{where}: after the warm-up the order is {steady}, expected one "
                       "forward, one backward, in turn, until the forwards are done")


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
