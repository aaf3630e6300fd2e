"""Lesson 14's save_checkpoint / load_checkpoint: a run killed after a checkpoint and resumed
from it ends with the weights of the run never interrupted, bit for bit. That needs the model,
the optimizer (momentum, learning rate) and every rank's own random generators back."""
import random
import shutil
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from dist_sgd.course.grade import Grader

grader = Grader("save_checkpoint", after_case=lambda: _remove_folders(), error_hints={
    "No such file": "load_checkpoint reads what save_checkpoint wrote: the same folder and "
                    "file names, on every rank (and a dist.barrier() when one rank writes "
                    "what the others read)"})
STEPS, KILLED_AT = 6, 3
MOMENTUM_HINT = "the optimizer's state_dict() holds the momentum and the learning rate: save " \
                "it, and load it with optimizer.load_state_dict"
RNG_HINT = "dropout, the data and the jitter come from the random generators: save " \
           "torch.get_rng_state() and random.getstate(), and set them back on load"


def _model(seed=0):
    torch.manual_seed(seed)  # the same weights on every rank
    return nn.Sequential(nn.Linear(6, 8), nn.Dropout(0.3), nn.Tanh(), nn.Linear(8, 2))


def _optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def _seed(ctx, base):
    """Each rank its own torch stream (its data, its dropout masks), as in data-parallel
    training; python's the same on every rank (the learning-rate jitter: one model)."""
    torch.manual_seed(base + ctx.rank)
    random.seed(base)


def _step(ctx, model, opt):
    """One step that draws from every generator: data and dropout (torch), a learning-rate
    jitter (python's random); gradients averaged over the ranks, as DDP does."""
    x, y = torch.randn(4, 6), torch.randn(4, 2)
    for g in opt.param_groups:
        g["lr"] = 0.1 * (1 + 0.1 * random.random())
    opt.zero_grad()
    F.mse_loss(model(x), y).backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= ctx.world_size
    opt.step()


_MADE = []  # the folders rank 0 made: gone after each case, also one that failed half-way


def _folder(ctx):
    """One fresh folder, the same on every rank."""
    if ctx.rank == 0:
        _MADE.append(tempfile.mkdtemp(prefix="ckpt_"))
    return ctx.everyone(_MADE[-1] if ctx.rank == 0 else None)[0]


def _finish(ctx, folder):
    ctx.everyone(None)  # every rank is done reading before the folder goes
    _remove_folders()


def _remove_folders():
    """Rank 0's folders go (once every rank is past the case: the grader's after_case)."""
    while _MADE:
        shutil.rmtree(_MADE.pop(), ignore_errors=True)


def _new_process(ctx):
    """What a restarted process starts from: other weights, a fresh optimizer, other streams."""
    model = _model(seed=5)
    _seed(ctx, 999)
    return model, _optimizer(model)


def _expect_step(ctx, state, step, wrong_step=()):
    """wrong_step: the hints for a dict naming another step (another checkpoint loaded)."""
    returned = isinstance(state, dict) and isinstance(state.get("step"), int)
    ctx.expect(returned and state["step"] == step,
               f"load_checkpoint returned {str(state)[:60]}, expected a dict with step {step}",
               wrong_step if returned else
               ["return {\"step\": the step saved} (None only when there is no checkpoint)"])


@grader.case("saved, then loaded into a fresh model: weights, momentum, learning rate",
             world_sizes=(1,))
def round_trip(ctx):
    """A fresh model and optimizer loaded from the checkpoint hold the saved weights, momentum
    buffers and learning rate, and the step is returned."""
    folder = _folder(ctx)
    model = _model()
    opt = _optimizer(model)
    _seed(ctx, 100)
    for _ in range(KILLED_AT):
        _step(ctx, model, opt)
    ctx.call(ctx.impl.save_checkpoint, folder, KILLED_AT, model, opt)
    fresh, fresh_opt = _new_process(ctx)
    state = ctx.call(ctx.impl.load_checkpoint, folder, fresh, fresh_opt)
    _finish(ctx, folder)
    _expect_step(ctx, state, KILLED_AT)
    for (name, p), q in zip(fresh.named_parameters(), model.parameters()):
        ctx.expect_close(p.detach(), q.detach(), f"{name} after loading", atol=0)
    for (name, p), q in zip(fresh.named_parameters(), model.parameters()):
        got = fresh_opt.state.get(p, {}).get("momentum_buffer")
        ctx.expect(got is not None, f"{name} has no momentum after loading", [MOMENTUM_HINT])
        ctx.expect_close(got, opt.state[q]["momentum_buffer"], f"{name}'s momentum", atol=0,
                         hints=[MOMENTUM_HINT])
    lr, want = fresh_opt.param_groups[0]["lr"], opt.param_groups[0]["lr"]
    ctx.expect(lr == want, f"the learning rate is {lr} after loading, expected {want}",
               [MOMENTUM_HINT])


@grader.case("killed after step 3 of 6 and resumed: the uninterrupted run's weights")
def resumed_run(ctx):
    """A run killed after step 3 and resumed from its latest checkpoint ends with the
    uninterrupted run's weights, bit for bit (model, optimizer and generators all restored)."""
    folder = _folder(ctx)
    straight = _model()
    opt = _optimizer(straight)
    _seed(ctx, 100)
    for step in range(1, STEPS + 1):
        _step(ctx, straight, opt)
        if step == KILLED_AT:  # what the resumed run's generators must hold after loading
            then = (torch.get_rng_state(), random.getstate())
    model = _model()
    opt = _optimizer(model)
    _seed(ctx, 100)
    for step in range(1, KILLED_AT + 1):
        _step(ctx, model, opt)
        if step >= KILLED_AT - 1:  # two checkpoints: the later one must load
            ctx.call(ctx.impl.save_checkpoint, folder, step, model, opt)
    model, opt = _new_process(ctx)  # the process died; a new one starts
    state = ctx.call(ctx.impl.load_checkpoint, folder, model, opt)
    # The evidence picks the hints: generators not as they were, momentum not there.
    hints = [RNG_HINT] if not (torch.equal(torch.get_rng_state(), then[0]) and
                               random.getstate() == then[1]) else []
    if any(opt.state.get(p, {}).get("momentum_buffer") is None for p in model.parameters()):
        hints.append(MOMENTUM_HINT)
    for _ in range(KILLED_AT, STEPS):  # every rank the same steps: the collectives pair up
        _step(ctx, model, opt)
    _finish(ctx, folder)
    _expect_step(ctx, state, KILLED_AT)
    for (name, p), q in zip(model.named_parameters(), straight.parameters()):
        ctx.expect_close(p.detach(), q.detach(), f"{name} after {STEPS} steps", atol=0,
                         hints=hints)


@grader.case("each rank's own random generators come back")
def own_generators(ctx):
    """After loading, each rank's torch and Python generators draw what they would have drawn
    uninterrupted: each rank's own state."""
    folder = _folder(ctx)
    model = _model()
    opt = _optimizer(model)
    _seed(ctx, 100)
    _step(ctx, model, opt)
    ctx.call(ctx.impl.save_checkpoint, folder, 1, model, opt)
    expected = (torch.rand(4), random.random())  # what this rank draws next, uninterrupted
    model, opt = _new_process(ctx)
    ctx.call(ctx.impl.load_checkpoint, folder, model, opt)
    got = (torch.rand(4), random.random())
    _finish(ctx, folder)
    hints = [RNG_HINT] if ctx.world_size == 1 else [
        "each rank's generators are its own: save them per rank (rank-{rank}.pt) and load "
        "this rank's, not rank 0's", RNG_HINT]
    ctx.expect_close(got[0], expected[0], "torch.rand(4) after loading", atol=0, hints=hints)
    ctx.expect(got[1] == expected[1], f"random.random() after loading is {got[1]}, expected "
               f"{expected[1]}", hints)


@grader.case("an empty folder: load_checkpoint returns None and changes nothing",
             world_sizes=(1,))
def nothing_yet(ctx):
    """Load_checkpoint on an empty folder returns None and leaves the model and optimizer as
    they were."""
    folder = _folder(ctx)
    model = _model()
    opt = _optimizer(model)
    before = [p.detach().clone() for p in model.parameters()]
    state = ctx.call(ctx.impl.load_checkpoint, folder, model, opt)
    _finish(ctx, folder)
    ctx.expect(state is None, f"load_checkpoint returned {str(state)[:60]}, expected None",
               ["a first run finds no checkpoint: return None, so the caller starts at step 0"])
    for p, q in zip(model.parameters(), before):
        ctx.expect_close(p.detach(), q, "a weight after loading nothing", atol=0)


@grader.case("an optimizer the checkpoint does not fit: ValueError, the model left as it was",
             world_sizes=(1,))
def refused(ctx):
    """A checkpoint loaded with an optimizer over 2 of the model's 4 parameters: a
    ValueError, and the model's weights left as they were."""
    folder = _folder(ctx)
    model = _model()
    opt = _optimizer(model)
    _seed(ctx, 100)
    _step(ctx, model, opt)
    ctx.call(ctx.impl.save_checkpoint, folder, 1, model, opt)
    fresh = _model(seed=5)
    before = [p.detach().clone() for p in fresh.parameters()]
    smaller = torch.optim.SGD(fresh[0].parameters(), lr=0.1, momentum=0.9)  # 2 of 4 params
    error = None
    try:
        ctx.call(ctx.impl.load_checkpoint, folder, fresh, smaller)
    except ValueError as e:
        error = e
    _finish(ctx, folder)
    ctx.expect(error is not None, "load_checkpoint into an optimizer over 2 of the model's 4 "
               "parameters raised no ValueError", [
                   "torch's optimizer.load_state_dict refuses state for other parameters "
                   "(ValueError): let it, or check first"])
    for (name, p), q in zip(fresh.named_parameters(), before):
        ctx.expect_close(p.detach(), q, f"{name} after a refused load (it promises to change "
                         "nothing)", atol=0, hints=[
                             "check that everything fits before changing anything: the model "
                             "is loaded last, or the optimizer's state is tried on a copy "
                             "first"])


@grader.case("checkpoints of steps 9 and 10 in one folder: step 10 loads", world_sizes=(1,))
def latest(ctx):
    """Checkpoints of steps 9 and 10 in one folder: step 10's loads (as text "step-10" sorts
    before "step-9")."""
    folder = _folder(ctx)
    model = _model()
    opt = _optimizer(model)
    _seed(ctx, 100)
    for step in (9, 10):
        _step(ctx, model, opt)
        ctx.call(ctx.impl.save_checkpoint, folder, step, model, opt)
    fresh, fresh_opt = _new_process(ctx)
    state = ctx.call(ctx.impl.load_checkpoint, folder, fresh, fresh_opt)
    _finish(ctx, folder)
    as_text = ["\"step-10\" < \"step-9\" as text: name the folders step-{step:08d} (they sort "
               "as numbers), or keep the latest's name in a file of its own"]
    _expect_step(ctx, state, 10, as_text)
    for (name, p), q in zip(fresh.named_parameters(), model.parameters()):
        ctx.expect_close(p.detach(), q.detach(), f"{name} after loading", atol=0,
                         hints=as_text)
