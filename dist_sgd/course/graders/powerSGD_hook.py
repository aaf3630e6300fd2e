"""Lesson 12's powerSGD_hook(state, bucket), registered on torch's DDP (register_comm_hook)
with our PowerSGDState: the gradients of torch's own powerSGD_hook with the same settings,
step for step (the plain all-reduce steps first, then compressed ones, where error feedback
and warm start carry from step to step), and the same residual kept for the next step.

One bucket (a large bucket_cap_mb): torch's powerSGD_hook waits inside its callbacks, which
on gloo with several buckets can hang. Every case ends with a barrier (no rank leaves while a
peer's reducer is still finishing)."""
import torch
import torch.distributed as dist
import torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook as torch_powersgd
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from dist_sgd.course.grade import Grader
from dist_sgd.course.graders.fp16_compress_hook import Model  # 9 x 12 and 7 x 9, biases
from dist_sgd.ddp.compress import PowerSGDState

grader = Grader("powerSGD_hook", error_hints={
    "KeyError: 0": "state.error_dict has no entry for a bucket the first time: create it as "
                "zeros (torch.zeros_like(buffer))",
    "cannot be multiplied": "P = M Q is n x r (M is n x m, Q is m x r); Q = M^T P is m x r"})
PER_RANK, STEPS, START = 6, 5, 2  # steps 0 and 1: plain all-reduce; 2, 3, 4: compressed
TOL = dict(atol=1e-10, rtol=1e-8)  # float64: only the order of the sums differs from torch's


def _train(state, hook, rank):
    torch.manual_seed(0)
    ddp = TorchDDP(Model().double(), bucket_cap_mb=1000)  # one bucket
    ddp.register_comm_hook(state, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    grads = []
    for step in range(STEPS):
        g = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(PER_RANK, 12, generator=g, dtype=torch.float64)
        y = torch.randn(PER_RANK, 7, generator=g, dtype=torch.float64)
        opt.zero_grad()
        F.mse_loss(ddp(x), y).backward()
        grads.append([p.grad.clone() for p in ddp.parameters()])
        opt.step()
    return grads


def _against_torch(ctx, rank, error_feedback, warm_start):
    settings = dict(matrix_approximation_rank=rank, start_powerSGD_iter=START,
                    use_error_feedback=error_feedback, warm_start=warm_start, random_seed=7)
    theirs = torch_powersgd.PowerSGDState(None, **settings)
    expected = _train(theirs, torch_powersgd.powerSGD_hook, ctx.rank)
    mine = PowerSGDState(None, **settings)

    def hook(state, bucket):  # torch's register_comm_hook wants these names
        fut = ctx.call(ctx.impl.powerSGD_hook, state, bucket)
        if isinstance(fut, torch.futures.Future) and fut.done():
            fut.wait()  # a failure already there: raise it here, by its own name (torch's
        return fut      # DDP would report it as "Unable to cast ... to Tensor")

    got = _train(mine, hook, ctx.rank)
    dist.barrier()
    names = [n for n, _ in Model().named_parameters()]
    for step, (a_step, b_step) in enumerate(zip(got, expected)):
        kind = "plain all-reduce" if step < START else "compressed"
        for name, a, b in zip(names, a_step, b_step):
            ctx.expect_close(a, b, f"step {step} ({kind}): {name}.grad", **TOL,
                             hints=_hints(step, error_feedback))
    if error_feedback:
        ctx.expect(set(mine.error_dict) == set(theirs.error_dict), f"state.error_dict has "
                   f"buckets {sorted(mine.error_dict)}, expected {sorted(theirs.error_dict)}")
        for index, error in theirs.error_dict.items():
            ctx.expect_close(mine.error_dict[index], error, f"the residual kept for bucket "
                             f"{index} after {STEPS} steps", **TOL, hints=[
                                 "error_dict[index] = the gradient before compression (its "
                                 "residual added) minus the P Q^T all ranks agreed on"])
    ctx.expect_same_on_every_rank(torch.cat([g.flatten() for g in got[-1]]),
                                  "the last step's gradients")


def _hints(step, error_feedback):
    if step < START:
        return ["before start_powerSGD_iter the bucket is only averaged: leave that part as "
                "it is"]
    if step == START:
        return ["the first compressed step: P = M Q, the P's summed, orthogonalized, Q = M^T "
                "P, the Q's summed and divided by the world size, M = P Q^T"]
    return ["a later compressed step: " + ("the residual of the step before must be added "
                                           "once, before compressing" if error_feedback else
                                           "the Q of the step before is the start (warm start)")]


@grader.case("rank 1 with error feedback and warm start: torch's gradients, 5 steps")
def rank_1(ctx):
    """Five steps (plain all-reduce first, then compressed) give torch's powerSGD_hook's
    gradients and residuals, at matrix rank 1 with error feedback and warm start."""
    _against_torch(ctx, 1, error_feedback=True, warm_start=True)


@grader.case("rank 2 with error feedback, no warm start: torch's gradients, 5 steps")
def rank_2(ctx):
    """The same at matrix rank 2 without warm start: a fresh Q every step."""
    _against_torch(ctx, 2, error_feedback=True, warm_start=False)


@grader.case("rank 1 without error feedback: torch's gradients, 5 steps")
def no_error_feedback(ctx):
    """The same without error feedback: no residual kept."""
    _against_torch(ctx, 1, error_feedback=False, warm_start=True)
