"""The one training step every benchmark times, synchronized each way lessons 06-09 build.

    single process            no communication: every rank steps alone (the floor; p = 1's baseline)
    average_gradients         lesson 06: after backward, one all-reduce per parameter
    average_gradients, flat   the same, every gradient in one flat all-reduce
    per-parameter hooks       lesson 07, step 2: each gradient's hook starts its async all-reduce
    our DDP                   lesson 07, step 3: buckets, all-reduced during backward
    torch DDP                 torch.nn.parallel.DistributedDataParallel
    our DDP + PowerSGD        our DDP with our powerSGD_hook (lesson 12): rank 2, error
                              feedback, from step POWERSGD_START on (time steps after it)

A step is forward, nll loss, backward, the strategy's gradient sync, SGD update, on a fixed
random batch of MNIST's shape: a step's time does not depend on pixel values, and no dataset
has to be read. Every rank must build the same strategies in the same order (the wrappers
broadcast and register their buckets collectively).
"""
import copy
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from dist_sgd.ddp import compress
from dist_sgd.ddp.ddp import DistributedDataParallel
from dist_sgd.ddp.steps import HookDDP, NaiveDDP
from dist_sgd.sgd import models

STRATEGIES = ("single process", "average_gradients", "average_gradients, flat",
              "per-parameter hooks", "our DDP", "torch DDP", "our DDP + PowerSGD")
ONE_BUCKET = 1024.0  # MiB: one bucket for any model here (bucket_cap_mb=None below)
DEFAULTS = "defaults"  # bucket_cap_mb=DEFAULTS: torch's default, 25 MiB with a 1 MiB first bucket
POWERSGD_START = 2  # plain all-reduce before it (torch: DDP rebuilds its buckets after step 0)


def build(model_name, seed=0):
    """models.MODELS[model_name], initialized the same way on every rank."""
    torch.manual_seed(seed)
    model = models.MODELS[model_name]()
    model.apply(models.init_weights)
    return model


def batch(size, seed=0):
    """A random batch of MNIST's shape, different on every rank."""
    gen = torch.Generator().manual_seed(seed + (dist.get_rank() if dist.is_initialized() else 0))
    return torch.randn(size, 1, 28, 28, generator=gen), torch.randint(0, 10, (size,), generator=gen)


def wrap(strategy, model, bucket_cap_mb=25.0):
    """`model` wrapped for `strategy` (bucket_cap_mb: a number; None = one bucket; DEFAULTS)."""
    cap = {None: ONE_BUCKET, DEFAULTS: None}.get(bucket_cap_mb, bucket_cap_mb)
    if strategy == "our DDP":
        return DistributedDataParallel(model, bucket_cap_mb=cap)
    if strategy == "torch DDP":
        return TorchDDP(model, bucket_cap_mb=cap)
    if strategy == "our DDP + PowerSGD":
        wrapped = DistributedDataParallel(model, bucket_cap_mb=cap)
        wrapped.register_comm_hook(compress.PowerSGDState(
            None, matrix_approximation_rank=2, start_powerSGD_iter=POWERSGD_START),
            compress.powerSGD_hook)
        return wrapped
    return {"single process": lambda: model,
            "average_gradients": lambda: NaiveDDP(model),
            "average_gradients, flat": lambda: NaiveDDP(model, flat=True),
            "per-parameter hooks": lambda: HookDDP(model)}[strategy]()


def make_step(strategy, model, x, y, bucket_cap_mb=25.0):
    """A zero-argument training step on a private copy of `model`. Its attributes: .wrapped,
    .loss() (a forward pass), .sync_seconds (time in the explicit sync call after backward:
    all of average_gradients' communication; for hooks and DDPs what backward left to wait)."""
    local = copy.deepcopy(model)
    wrapped = wrap(strategy, local, bucket_cap_mb)
    opt = torch.optim.SGD(local.parameters(), lr=0.01)
    finish = getattr(wrapped, "finish_gradient_synchronization", lambda: None)

    def step():
        opt.zero_grad()
        step.loss().backward()
        start = time.perf_counter()
        finish()  # all of average_gradients' work; for the others, what is still in flight
        step.sync_seconds.append(time.perf_counter() - start)
        opt.step()
    step.wrapped, step.sync_seconds = wrapped, []
    step.loss = lambda: F.nll_loss(wrapped(x), y)
    return step


def make_steps(model, x, y, strategies, bucket_cap_mb=25.0):
    """{strategy: make_step(strategy, ...)} for each of `strategies`, same model and batch."""
    return {name: make_step(name, model, x, y, bucket_cap_mb) for name in strategies}
