"""Lesson 08's DataParallel(module, device_ids, output_device, dim) with its scatter and gather:
one process, the batch split over replicas run in threads (here CPU replicas), outputs
gathered into one; one backward gives one process's gradients. scatter and gather follow
torch.nn.DataParallel's rules (torch.nn.parallel.scatter_gather, its CUDA copies replaced by
their CPU equivalents, chunk and cat). DataParallel is single-process: world size 1 only."""
import threading
import warnings
from collections import namedtuple
from contextlib import contextmanager

import torch
import torch.nn as nn
import torch.nn.parallel.scatter_gather as torch_sg

from dist_sgd.course.grade import Grader

grader = Grader("DataParallel", error_hints={
    "out of range": "torch's chunk may give fewer chunks than devices (5 rows on 4 devices: "
                    "2 + 2 + 1): run only as many replicas as there are chunks",
    "zip() argument": "zip() stops at the shortest on purpose: over 4 devices a tensor of 5 "
                      "rows gives 3 chunks, anything else 4 copies, and 3 replicas run (no "
                      "strict=True in scatter)",
    "Sizes of tensors must match except in dimension":
        "gather concatenates the replicas' outputs along dim: they differ in size there only, "
        "so torch.cat(outputs, dim=dim), the dim the batch was scattered on"})
Pair = namedtuple("Pair", "left right")
CPU = torch.device("cpu")
AS_IT_IS = "anything but a tensor or a container goes to every replica as it is"
REPLICATE = ("the replicas' parameters must be autograd copies of the module's own (replicate), "
             "not independent copies (copy.deepcopy): backward must reach the originals")
CHUNKS = ("torch's rule is tensor.chunk(p, dim): ceil(n / p) rows per chunk, the last ones "
          "shorter or missing (10 rows over 4: 3 + 3 + 3 + 1)")


@contextmanager
def _torch_rules_on_cpu():
    """torch's scatter/gather with their CUDA-only leaf copies swapped for chunk and cat."""
    class Scatter:
        @staticmethod
        def apply(devices, chunk_sizes, dim, t):
            return t.chunk(len(devices), dim)

    class Gather:
        @staticmethod
        def apply(device, dim, *ts):
            if dim == 0 and all(t.dim() == 0 for t in ts):
                ts = [t.view(1) for t in ts]
            return torch.cat(ts, dim)

    saved = torch_sg.Scatter, torch_sg.Gather
    torch_sg.Scatter, torch_sg.Gather = Scatter, Gather
    try:
        yield
    finally:
        torch_sg.Scatter, torch_sg.Gather = saved


def _same(ctx, got, expected, what, hints=()):
    """got is expected: the same containers (type, length, keys) and the same tensors."""
    shown = type(expected).__name__
    # The hint for what should have been there: a container rebuilt, or an object passed on.
    ctx.expect(type(got) is type(expected), f"{what} is a {type(got).__name__}, expected a "
               f"{shown}", ["rebuild each container as its own type: type(obj)(...), "
                            "namedtuples with type(obj)(*parts)"]
               if isinstance(expected, (tuple, list, dict)) else
               [] if isinstance(expected, torch.Tensor) else [AS_IT_IS])
    if isinstance(expected, torch.Tensor):
        ctx.expect_close(got, expected, what, atol=0, hints=hints)
    elif isinstance(expected, (tuple, list)):
        ctx.expect(len(got) == len(expected), f"{what} has {len(got)} entries, expected "
                   f"{len(expected)}", ["one entry per chunk: torch's chunk can give fewer "
                                        "chunks than devices"])
        for i, (a, b) in enumerate(zip(got, expected)):
            _same(ctx, a, b, f"{what}[{i}]", hints)
    elif isinstance(expected, dict):
        ctx.expect(list(got) == list(expected), f"{what} has keys {list(got)}, expected "
                   f"{list(expected)}")
        for k in expected:
            _same(ctx, got[k], expected[k], f"{what}[{k!r}]", hints)
    else:
        ctx.expect(got == expected, f"{what} is {got!r}, expected {expected!r}", [AS_IT_IS])


def _inputs(rows, dim):
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 3, generator=g) if dim == 0 else torch.randn(2, rows, generator=g)
    return (x, [x + 1, "tag"], {"a": x * 2, "b": None}, Pair(x - 1, 7), 0.5)


@grader.case("scatter: 10, 5 and 3 rows over 4 devices, nested containers, as torch")
def scatter_like_torch(ctx):
    """Scatter splits tensors in nested containers as torch's scatter does (tensor.chunk along
    dim), uneven and along dim 1 too."""
    for rows, devices, dim in ((10, 4, 0), (5, 4, 0), (3, 4, 0), (7, 3, 1)):
        obj = _inputs(rows, dim)
        with _torch_rules_on_cpu():
            expected = torch_sg.scatter(obj, [CPU] * devices, dim)
        got = ctx.call(ctx.impl.scatter, obj, [CPU] * devices, dim)
        _same(ctx, list(got), expected, f"scatter of {rows} rows over {devices} devices "
                                        f"(dim {dim})", [CHUNKS])


@grader.case("gather: tuples, dicts, None, namedtuples and one loss per replica, as torch")
def gather_like_torch(ctx):
    """Gather rebuilds tuples, dicts, None, namedtuples and per-replica losses as torch's
    gather does, concatenating along dim."""
    for replicas, dim in ((3, 0), (2, 1)):
        g = torch.Generator().manual_seed(replicas)
        outputs = [(Pair(torch.randn(2, 3, generator=g), None),
                    {"h": [torch.randn(i + 1, 3, generator=g) if dim == 0 else
                           torch.randn(3, i + 1, generator=g)],
                     "loss": torch.tensor(float(i))}) for i in range(replicas)]
        if dim == 1:
            for out in outputs:
                del out[1]["loss"]  # 0-d tensors are gathered along dim 0 only
        with _torch_rules_on_cpu():
            expected = torch_sg.gather(outputs, CPU, dim)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = ctx.call(ctx.impl.gather, outputs, CPU, dim)
        _same(ctx, got, expected, f"gather of {replicas} outputs (dim {dim})")


class KeywordsAndTuple(nn.Module):
    """A keyword tensor and a keyword float, a tied weight, a frozen layer, a tuple output with
    a dict in it."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 5)
        self.frozen = nn.Linear(5, 5).requires_grad_(False)
        self.b, self.c = nn.Linear(5, 5), nn.Linear(5, 5)
        self.c.weight = self.b.weight

    def forward(self, x, mask=None, scale=1.0):
        h = torch.tanh(self.frozen(torch.tanh(self.a(x))))
        return self.b(h) * mask * scale, {"h": torch.tanh(self.c(h))}


def _one_process_and_ours(ctx, rows, replicas, dim=0):
    torch.manual_seed(0)
    single = KeywordsAndTuple().double()
    torch.manual_seed(0)
    mine = KeywordsAndTuple().double()
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 6, generator=g, dtype=torch.float64)
    mask = (torch.rand(rows, 5, generator=g) > 0.3).double()
    model = ctx.call(ctx.impl.DataParallel, mine, device_ids=["cpu"] * replicas)
    results = []
    for m in (single, model):
        out, extra = m(x, mask=mask, scale=0.5) if m is single else \
            ctx.call(m, x, mask=mask, scale=0.5)
        (out.square().sum() + extra["h"].sum()).backward()
        results.append((out, extra))
    return single, mine, results


def _expect_one_process(ctx, single, mine, results, where):
    (out_1, extra_1), (out, extra) = results
    ctx.expect(isinstance(extra, dict) and "h" in extra, f"{where}: the output's dict is "
               f"{type(extra).__name__}, expected a dict with key 'h'")
    ctx.expect_close(out.detach(), out_1.detach(), f"{where}: the output", atol=1e-12)
    ctx.expect_close(extra["h"].detach(), extra_1["h"].detach(), f"{where}: the output's "
                     f"['h']", atol=1e-12)
    for (name, p), q in zip(mine.named_parameters(), single.parameters()):
        if q.grad is None:
            ctx.expect(p.grad is None, f"{where}: {name}.grad is set, expected None")
            continue
        ctx.expect(p.grad is not None, f"{where}: {name}.grad is None after backward",
                   [REPLICATE])
        # The output is right (checked above), so every row ran once: a gradient that is not
        # right did not reach the module's own parameters from every replica.
        ctx.expect_close(p.grad, q.grad, f"{where}: {name}.grad", atol=1e-12, rtol=1e-10,
                         hints=[REPLICATE])


@grader.case("forward and backward, 7 rows over 3 replicas: one process's output and gradients")
def one_process(ctx):
    """Forward and backward through DataParallel give one process's output and gradients on the
    whole batch (keyword inputs, tied and frozen weights)."""
    single, mine, results = _one_process_and_ours(ctx, 7, 3)
    _expect_one_process(ctx, single, mine, results, "7 rows over 3 replicas")


@grader.case("5 rows over 4 replicas (3 chunks), 1 row over 2, and 1 replica")
def fewer_chunks(ctx):
    """The same when there are fewer rows than replicas (fewer chunks than devices) and with
    one replica."""
    for rows, replicas in ((5, 4), (1, 2), (4, 1)):
        single, mine, results = _one_process_and_ours(ctx, rows, replicas)
        _expect_one_process(ctx, single, mine, results, f"{rows} rows over {replicas} replicas")


class _Meet(nn.Module):
    """A replica's forward waits at a barrier until every replica has reached it: replicas
    running at once, each in a thread of its own, all arrive; run one after the other, the
    first waits alone (the timeout is for that failure only, never reached otherwise; shorter
    than the grading's patience, after which a rank that only waits counts as hung)."""

    def __init__(self, replicas, timeout):
        super().__init__()
        self.lin = nn.Linear(4, 2)
        self.met = {"barrier": threading.Barrier(replicas, timeout=timeout), "threads": set()}

    def forward(self, x):
        self.met["threads"].add(threading.get_ident())
        try:
            self.met["barrier"].wait()
        except threading.BrokenBarrierError:
            self.met["alone"] = True
        return self.lin(x)


@grader.case("the replicas run at once, each in a thread: 3 forwards meet at a barrier")
def threads(ctx):
    """Three replicas' forwards meet at a barrier: they run at the same time, each in a
    thread of its own (run one after the other, the first waits alone), and the output is
    still the module's."""
    torch.manual_seed(0)
    wait = min(5.0, ctx.patience / 2)
    module = _Meet(3, wait)
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(3))
    model = ctx.call(ctx.impl.DataParallel, module, device_ids=["cpu"] * 3)
    out = ctx.call(model, x)
    ctx.expect(not module.met.get("alone"), f"a replica's forward waited {wait:g} s at a barrier "
               "for the other replicas, which never came while it ran", [
                   "run the replicas at the same time, one thread each: start every thread "
                   "first, then join them all (parallel_apply does it)"])
    ctx.expect(len(module.met["threads"]) == 3, f"the 3 replicas ran in "
               f"{len(module.met['threads'])} thread(s), expected 3")
    ctx.expect_close(out.detach(), module.lin(x).detach(), "the output", atol=1e-6)
