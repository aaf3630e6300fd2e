"""dist_sgd.comm.collectives against torch.distributed (gloo), on the same inputs, at world sizes 1-4.

One group per world size (a spawn costs seconds) runs every case inside the ranks
(dist_sgd.plumbing.cases) and returns what each returned. Each case (a function marked @part) sits right above the tests that read it.
Inside the ranks a failed comparison is recorded under its property's name, not raised, so a
broken piece fails the test that names it and leaves the others alone.

Cases: every collective and all-reduce algorithm; every reduce op gloo has, on every dtype
gloo reduces; float32/float64/int64 on awkward tensors (empty, 0-d, one element, fewer
elements than ranks, odd sizes, non-contiguous views); the ring's messages counted at 16 MiB;
the order in which receives and sends are posted; bad input.
"""
import contextlib
import hashlib
import io
import math
import os
import re
import time

import pytest
import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from dist_sgd.comm import collectives as C
from dist_sgd.comm import ring_pipelined
from dist_sgd.plumbing.cases import Cases
from dist_sgd.plumbing.launch import launch
from dist_sgd.comm.wire import split

OPS = {"sum": ReduceOp.SUM, "product": ReduceOp.PRODUCT, "min": ReduceOp.MIN, "max": ReduceOp.MAX}
ALL_OPS = ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")
DTYPES = (torch.float32, torch.float64, torch.int64)
EVERY_DTYPE = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
               torch.complex128, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
               torch.bool)
# name -> (shape of the tensor passed in, how it is laid out)
KINDS = {"0-d": ((), "contiguous"), "empty": ((0,), "contiguous"), "one": ((1,), "contiguous"),
         "three": ((3,), "contiguous"),  # fewer elements than ranks at world size 4
         "seven": ((7,), "contiguous"), "1001": ((1001,), "contiguous"),
         "matrix": ((3, 5), "contiguous"), "transposed": ((5, 3), "transposed"),
         "strided": ((33,), "strided")}
SOME_DTYPES = (torch.float16, torch.float64, torch.complex64, torch.int64, torch.uint8, torch.bool)
BIG = 4 * 2 ** 20  # float32 elements: 16 MiB


def values(shape, dtype, op, seed):
    """Inputs that keep every op exact enough: PRODUCT gets values near 1 (floats) or in
    -2..2 (ints), so four ranks neither overflow nor underflow; bitwise ops get 0..255."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) < 0.5
    if dtype.is_floating_point or dtype.is_complex:
        if op in ("product", "PRODUCT"):
            x = 0.9 + 0.2 * torch.rand(shape, generator=g, dtype=torch.float64)
        else:
            x = torch.randn(shape, generator=g, dtype=torch.float64)
        if dtype.is_complex:
            x = torch.complex(x, torch.randn(shape, generator=g, dtype=torch.float64))
        return x.to(dtype)
    low, high = {"product": (-2, 3), "PRODUCT": (-2, 3)}.get(op, (-50, 51))
    if dtype == torch.uint8 or op in ("BAND", "BOR", "BXOR"):
        low, high = (0, 3) if op in ("product", "PRODUCT") else (0, 60)
    return torch.randint(low, high, shape, generator=g).to(dtype)


def make(kind, dtype, op, seed):
    """(the tensor to pass, its base when it is a view into a bigger tensor, else None)."""
    shape, layout = KINDS[kind]
    if layout == "transposed":
        base = values(shape[::-1], dtype, op, seed)
        return base.t(), base
    if layout == "strided":
        base = values((2 * shape[0],), dtype, op, seed)
        return base[::2], base
    return values(shape, dtype, op, seed), None


def exact(dtype, op):
    return not (dtype.is_floating_point or dtype.is_complex) or op in ("min", "max", "MIN", "MAX")


class Recorder:
    """Per property: how many comparisons ran, which failed (messages), and digests of what
    every rank ended with (ranks must agree bit for bit)."""

    def __init__(self):
        self.count, self.failed, self.digests = {}, {}, {}

    def same(self, prop, name, got, expected, is_exact, digest=True, equal_nan=False):
        self.count[prop] = self.count.get(prop, 0) + 1
        try:
            tol = {"rtol": 0, "atol": 0} if is_exact else {}
            if got.dtype in (torch.float16, torch.bfloat16):  # sums in another order: last bits
                tol = {"rtol": 2e-2, "atol": 2e-2}
            torch.testing.assert_close(got, expected, equal_nan=equal_nan, **tol)
        except AssertionError as e:
            self.failed.setdefault(prop, []).append(f"{name}: {str(e).splitlines()[0]}")
        if digest:
            raw = got.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()
            self.digests[name] = hashlib.sha1(raw).hexdigest()


# ---- one spawned group per world size runs every part below --------------------------------

def recorder(rank, size):
    """What every part receives after rank and size: this rank's one Recorder."""
    return (Recorder(),)


CASES = Cases(setup=recorder)


def part(key):
    """Mark fn(rank, size, rec) as a case run inside the ranks; its value is read at `key`."""
    return CASES.case(key)


class Read(dict):
    """One rank's values by part, and the Recorder's count, failed and digests; reading a part
    that raised inside the ranks fails with its message."""

    def __init__(self, outcomes):
        super().__init__({k: o.value for k, o in outcomes.items() if o.failure is None})
        self.failures = {k: o.failure for k, o in outcomes.items() if o.failure is not None}
        self.update(self.pop("recorded", None) or {})

    def __missing__(self, key):
        raise AssertionError(self.failures.get(key, f"no part {key!r} ran"))


@pytest.fixture(scope="module", params=[1, 2, 3, 4])
def results(request):
    return request.param, [Read(r) for r in CASES.results(request.param)]


def passed(res, prop, at_least=1):
    for rank, r in enumerate(res):
        assert r["count"].get(prop, 0) >= at_least, f"rank {rank} ran {r['count'].get(prop, 0)} {prop} checks"
        assert prop not in r["failed"], f"rank {rank}: {r['failed'][prop][:5]}"


# ---- equal to torch.distributed -----------------------------------------------------------

@part("all_reduce")
def check_all_reduce(rank, size, rec):
    # Every op on the ring, SUM on the others (check_every_op runs every op on every algorithm).
    for alg in C.ALL_REDUCE_ALGORITHMS:
        for op_name, op in OPS.items() if alg == "ring" else [("sum", OPS["sum"])]:
            for dtype in DTYPES:
                for i, kind in enumerate(KINDS):
                    ours, base = make(kind, dtype, op_name, 1000 * i + 10 * rank)
                    ref = ours.contiguous().clone()
                    dist.all_reduce(ref, op=op)
                    gaps = base[1::2].clone() if KINDS[kind][1] == "strided" else None
                    C.all_reduce(ours, op=op, algorithm=alg)
                    name = f"all_reduce/{alg}/{op_name}/{dtype}/{kind}"
                    rec.same("all_reduce", name, ours, ref, exact(dtype, op_name))
                    if gaps is not None:  # a strided view: the gaps must stay as they were
                        rec.same("all_reduce", name + "/gaps", base[1::2], gaps, True, digest=False)


def test_all_reduce_matches_torch_every_algorithm(results):
    size, res = results
    passed(res, "all_reduce", (len(OPS) + len(C.ALL_REDUCE_ALGORITHMS) - 1) * len(DTYPES) * len(KINDS))


@part("rooted")
def check_rooted(rank, size, rec):
    """broadcast, reduce, gather, scatter: every kind at the last root (not 0, the tree's
    favourite) with every dtype, and reduce with SUM and MAX; float32 and SUM at the other
    roots (check_every_op runs reduce with every op)."""
    for root in range(size):
        for dtype in DTYPES if root == size - 1 else DTYPES[:1]:
            for i, kind in enumerate(KINDS):
                seed = 7 + 1000 * i + 10 * rank
                ours, _ = make(kind, dtype, "sum", seed)
                ref = ours.contiguous().clone()
                dist.broadcast(ref, src=root)
                C.broadcast(ours, src=root)
                rec.same("broadcast", f"broadcast/{root}/{dtype}/{kind}", ours, ref, True)

                for op_name, op in list(OPS.items())[::3] if root == size - 1 else [("sum", ReduceOp.SUM)]:
                    ours, _ = make(kind, dtype, op_name, seed)
                    before, ref = ours.clone(), ours.contiguous().clone()
                    dist.reduce(ref, dst=root, op=op)
                    C.reduce(ours, dst=root, op=op)
                    # torch leaves non-dst tensors undefined (gloo changes them); ours, alone
                    rec.same("reduce", f"reduce/{root}/{op_name}/{dtype}/{kind}/{rank}", ours,
                             ref if rank == root else before,
                             exact(dtype, op_name) or rank != root, digest=False)

                mine, _ = make(kind, dtype, "sum", seed)
                theirs = [torch.zeros_like(mine).contiguous() for _ in range(size)] if rank == root else None
                ours = [make(kind, dtype, "sum", 99991)[0].zero_() for _ in range(size)] if rank == root else None
                dist.gather(mine.contiguous(), theirs, dst=root)
                C.gather(mine, ours, dst=root)
                if rank == root:
                    for j in range(size):
                        rec.same("gather", f"gather/{root}/{dtype}/{kind}/{j}", ours[j], theirs[j], True,
                                 digest=False)

                pieces = [make(kind, dtype, "sum", seed + 1 + j)[0] for j in range(size)]
                ref, ours = torch.zeros_like(mine).contiguous(), make(kind, dtype, "sum", 99991)[0]
                dist.scatter(ref, [p.contiguous() for p in pieces] if rank == root else None, src=root)
                C.scatter(ours, pieces if rank == root else None, src=root)
                rec.same("scatter", f"scatter/{root}/{dtype}/{kind}/{rank}", ours, ref, True, digest=False)


def test_broadcast_matches_torch_from_every_root(results):
    passed(results[1], "broadcast", (len(DTYPES) + results[0] - 1) * len(KINDS))


def test_reduce_matches_torch_and_leaves_other_ranks_alone(results):
    passed(results[1], "reduce", (2 * len(DTYPES) + results[0] - 1) * len(KINDS))


def test_gather_and_scatter_match_torch(results):
    size = results[0]
    passed(results[1], "scatter", (len(DTYPES) + size - 1) * len(KINDS))
    assert sum(r["count"].get("gather", 0) for r in results[1]) == size * (len(DTYPES) + size - 1) * len(KINDS)
    passed(results[1], "gather", 0)


@part("all_to_all")
def check_all_to_all(rank, size, rec):
    """all_gather and reduce_scatter: lists of awkward tensors, inputs left unchanged."""
    for dtype in DTYPES:
        for i, kind in enumerate(KINDS):
            seed = 13 + 1000 * i + 10 * rank
            mine, _ = make(kind, dtype, "sum", seed)
            theirs = [torch.zeros_like(mine).contiguous() for _ in range(size)]
            ours = [make(kind, dtype, "sum", 99991)[0].zero_() for _ in range(size)]
            dist.all_gather(theirs, mine.contiguous())
            C.all_gather(ours, mine)
            for j in range(size):
                rec.same("all_gather", f"all_gather/{dtype}/{kind}/{j}", ours[j], theirs[j], True)

            for op_name, op in list(OPS.items())[::3]:  # SUM and MAX; every op: check_every_op
                inputs = [make(kind, dtype, op_name, seed + j)[0] for j in range(size)]
                saved = [t.clone() for t in inputs]
                ref, out = torch.zeros_like(mine).contiguous(), make(kind, dtype, "sum", 99991)[0]
                dist.reduce_scatter(ref, [t.contiguous() for t in inputs], op=op)
                C.reduce_scatter(out, inputs, op=op)
                name = f"reduce_scatter/{op_name}/{dtype}/{kind}/{rank}"
                rec.same("reduce_scatter", name, out, ref, exact(dtype, op_name), digest=False)
                for t, s in zip(inputs, saved):
                    rec.same("reduce_scatter", name + "/input", t, s, True, digest=False)


def test_all_gather_and_reduce_scatter_match_torch_inputs_unchanged(results):
    size, res = results
    passed(res, "all_gather", size * len(DTYPES) * len(KINDS))
    passed(res, "reduce_scatter", 2 * (size + 1) * len(DTYPES) * len(KINDS))


def test_every_rank_ends_with_identical_bytes(results):
    size, res = results
    first = res[0]["digests"]
    assert len(first) > 300
    for r, other in enumerate(res[1:], start=1):
        differ = [k for k in first if other["digests"][k] != first[k]]
        assert not differ, f"rank {r} ended with different bytes than rank 0 in {differ[:5]}"


def torch_refuses(call):
    """None if call() works, else "ExceptionType: first line of the message"."""
    try:
        call()
        return None
    except Exception as e:  # noqa: BLE001 - which exception is part of what we compare
        return f"{type(e).__name__}: {str(e).splitlines()[0]}"


@part("verdicts")
def check_every_op(rank, size, rec):
    """Every gloo ReduceOp on every dtype: ours gives torch's result where torch gives one,
    and refuses (before any message) exactly where torch refuses."""
    verdicts = {}
    for op_name in ALL_OPS:
        op = getattr(ReduceOp, op_name)
        for dtype in EVERY_DTYPE:
            x = values((11,), dtype, op_name, 50 + rank)
            ref, ours, trace = x.clone(), x.clone(), []
            torch_said = torch_refuses(lambda: dist.all_reduce(ref, op=op))
            out = io.StringIO()
            os.environ["DIST_SGD_VERBOSE"] = "1"
            try:
                with contextlib.redirect_stdout(out):
                    ours_said = torch_refuses(lambda: C.all_reduce(ours, op=op, trace=trace))
            finally:
                del os.environ["DIST_SGD_VERBOSE"]
            verdicts[op_name, str(dtype)] = (torch_said is not None, ours_said is not None,
                                             ours_said, trace == [] and out.getvalue() == "")
            if torch_said is None and ours_said is None:
                rec.same("every_op", f"all_reduce/ring/{op_name}/{dtype}", ours, ref, exact(dtype, op_name))
            if torch_said is None and ours_said is None and dtype in SOME_DTYPES:
                # and through reduce, reduce_scatter and every other algorithm
                ref, ours = x.clone(), x.clone()
                C.reduce(ours, dst=size - 1, op=op)
                if torch_refuses(lambda: dist.reduce(ref, dst=size - 1, op=op)) is None and rank == size - 1:
                    rec.same("every_op", f"reduce/{op_name}/{dtype}", ours, ref, exact(dtype, op_name),
                             digest=False)
                inputs = [values((5,), dtype, op_name, 70 + 10 * rank + j) for j in range(size)]
                ref, ours = torch.zeros(5, dtype=dtype), torch.zeros(5, dtype=dtype)
                C.reduce_scatter(ours, inputs, op=op)
                if torch_refuses(lambda: dist.reduce_scatter(ref, [t.clone() for t in inputs], op=op)) is None:
                    rec.same("every_op", f"reduce_scatter/{op_name}/{dtype}", ours, ref,
                             exact(dtype, op_name), digest=False)
                if dtype in (torch.int64, torch.float64, torch.bool):
                    for alg in C.ALL_REDUCE_ALGORITHMS:
                        ref, ours = x.clone(), x.clone()
                        dist.all_reduce(ref, op=op)
                        C.all_reduce(ours, op=op, algorithm=alg)
                        rec.same("every_op", f"all_reduce/{alg}/{op_name}/{dtype}", ours, ref,
                                 exact(dtype, op_name))
    return verdicts


def test_every_reduce_op_matches_gloo(results):
    size, res = results
    passed(res, "every_op", 50)
    accepted = [k for k, (torch_no, _, _, _) in res[0]["verdicts"].items() if not torch_no]
    assert len(accepted) >= 40, accepted  # bool, f16, bf16, complex SUM/AVG, ints...
    assert ("AVG", "torch.float32") in accepted and ("BXOR", "torch.bool") in accepted


def test_bad_dtype_rejected_before_any_message(results):
    """Ours refuses exactly the (op, dtype) pairs torch's gloo refuses, on every rank alike,
    with TypeError, before it sends or receives anything."""
    size, res = results
    verdicts = res[0]["verdicts"]
    assert sum(torch_no for torch_no, _, _, _ in verdicts.values()) >= 30
    for key, (torch_no, ours_no, message, silent) in verdicts.items():
        assert torch_no == ours_no, f"{key}: torch refuses: {torch_no}, ours: {ours_no} ({message})"
        if ours_no:
            assert message.startswith(("TypeError", "ValueError")), (key, message)
            assert silent, f"{key}: a message was traced or printed before the error"
    for r in res[1:]:
        assert r["verdicts"] == verdicts, "every rank refuses alike"


@part("nan")
def nan_min_max(rank, size, rec):
    """MIN and MAX with NaNs on some ranks, through every algorithm: a NaN on any rank makes
    the result NaN there, as torch.amin / torch.amax give on everyone's tensors stacked.
    gloo is not the reference here: which NaNs it keeps depends on the order it combines the
    ranks in (at world size 3, MIN on the inputs below gives [nan, 1, 5, -1, nan])."""
    nan = float("nan")
    inputs = torch.tensor([[nan, 1., 2., 3., 4.], [0., nan, 5., -1., 6.], [1., 2., nan, 0., nan],
                           [7., 8., 9., nan, 0.]])[:size]
    where = {}
    for op_name, op, whole in (("min", ReduceOp.MIN, torch.amin),
                               ("max", ReduceOp.MAX, torch.amax)):
        expected = whole(inputs, dim=0)  # NaN wherever any rank has one
        for alg in C.ALL_REDUCE_ALGORITHMS:
            x = inputs[rank].clone()
            C.all_reduce(x, op=op, algorithm=alg)
            rec.same("nan", f"nan/all_reduce/{alg}/{op_name}", x, expected, True,
                     digest=False, equal_nan=True)
            where[alg, op_name] = x.isnan().tolist()
        x = inputs[rank].clone()
        C.reduce(x, dst=size - 1, op=op)
        if rank == size - 1:
            rec.same("nan", f"nan/reduce/{op_name}", x, expected, True, digest=False,
                     equal_nan=True)
    return where


def test_min_and_max_propagate_every_nan(results):
    """Ours: a NaN on any rank is NaN in the result, whatever the algorithm and world size."""
    size, res = results
    passed(res, "nan", 2 * len(C.ALL_REDUCE_ALGORITHMS))
    if size == 3:  # positions 0-2 and 4 hold a NaN on some rank; only position 3 holds none
        for key, isnan in res[0]["nan"].items():
            assert isnan == [True, True, True, False, True], (key, isnan)


@part("pipelined")
def check_pipelined_segments(rank, size, rec):
    """ring_pipelined with tiny segments and window: many segments per message, buffers
    reposted; then the real segment size, with messages of more than one segment."""
    old = ring_pipelined.SEGMENT_BYTES, ring_pipelined.WINDOW
    ring_pipelined.SEGMENT_BYTES, ring_pipelined.WINDOW = 16, 2  # 4 float32 per segment
    traces = {}
    try:
        for n in (203, 300_000 * size + 3):
            if n > 1000:
                ring_pipelined.SEGMENT_BYTES, ring_pipelined.WINDOW = old
            for op_name in ("sum", "max"):
                x = values((n,), torch.float32, op_name, 31 * rank + 1)
                ref, trace = x.clone(), []
                dist.all_reduce(ref, op=OPS[op_name])
                C.all_reduce(x, op=OPS[op_name], algorithm="ring_pipelined", trace=trace)
                rec.same("pipelined", f"pipelined/{n}/{op_name}", x, ref, op_name == "max")
                traces[n] = trace
    finally:
        ring_pipelined.SEGMENT_BYTES, ring_pipelined.WINDOW = old
    return traces


def test_pipelined_ring_cuts_chunks_into_segments_and_matches_torch(results):
    size, res = results
    passed(res, "pipelined", 4)
    if size > 1:
        tiny = res[0]["pipelined"][203]
        assert tiny and all(m["nbytes"] <= 16 for m in tiny)  # SEGMENT_BYTES = 16
        big = res[0]["pipelined"][300_000 * size + 3]
        assert max(m["nbytes"] for m in big) == ring_pipelined.SEGMENT_BYTES


# ---- the ring's shape -------------------------------------------------------------------------

@part("traces")
def ring_messages(rank, size, rec):
    """The ring's trace: at 16 MiB, and at tiny sizes (chunks may be empty)."""
    traces = {}
    for n in (0, 1, 3, 7, 1001, BIG):
        traces[n] = []
        C.all_reduce(torch.ones(n), trace=traces[n])
    others = {}
    for alg in C.ALL_REDUCE_ALGORITHMS:
        others[alg] = []
        C.all_reduce(torch.ones(10), algorithm=alg, trace=others[alg])
    return traces, others


def test_ring_sends_2p_minus_1_chunks_each_way(results):
    """At 16 MiB: 2(p-1) messages per rank, each to the right neighbour, each <= ceil(n/p)."""
    size, res = results
    for rank, r in enumerate(res):
        trace = r["traces"][0][BIG]
        assert len(trace) == 2 * (size - 1), len(trace)
        assert [m["phase"] for m in trace] == ["reduce-scatter"] * (size - 1) + ["all-gather"] * (size - 1)
        assert all(m["numel"] <= math.ceil(BIG / size) and m["dst"] == (rank + 1) % size for m in trace)
        assert sum(m["nbytes"] for m in trace) >= 4 * 2 * (size - 1) * (BIG // size)


def test_ring_passes_chunks_in_textbook_order_even_when_empty(results):
    """Step s of reduce-scatter sends chunk r-s-1; of all-gather, chunk r-s. n < p: empty
    chunks still go, so the count is 2(p-1) whatever the size."""
    size, res = results
    for rank, r in enumerate(res):
        for n, trace in r["traces"][0].items():
            offsets = split(n, size)
            expected = [("reduce-scatter", s, (rank - s - 1) % size) for s in range(size - 1)]
            expected += [("all-gather", s, (rank - s) % size) for s in range(size - 1)]
            assert [(m["phase"], m["step"], m["chunk"]) for m in trace] == expected, (n, trace)
            sizes = [offsets[m["chunk"] + 1] - offsets[m["chunk"]] for m in trace]
            assert [m["numel"] for m in trace] == sizes, (n, trace)


def test_trace_records_every_algorithms_messages(results):
    size, res = results
    for rank, r in enumerate(res):
        for alg, trace in r["traces"][1].items():
            assert (len(trace) > 0) == (size > 1), (alg, trace)
            for m in trace:
                assert set(m) == {"algorithm", "phase", "step", "src", "dst", "chunk", "numel", "nbytes"}
                assert m["algorithm"] == alg and m["src"] == rank and m["dst"] != rank
                assert m["nbytes"] == 4 * m["numel"]


@part("orders")
def posting_order(rank, size, rec):
    """The order in which each collective calls dist.irecv / dist.isend on this rank."""
    calls, real = [], (dist.irecv, dist.isend)

    def irecv(t, src, *a, **k):
        calls.append(("recv", src))
        return real[0](t, src, *a, **k)

    def isend(t, dst, *a, **k):
        calls.append(("send", dst))
        return real[1](t, dst, *a, **k)

    runs = {alg: (lambda alg=alg: C.all_reduce(torch.ones(1000), algorithm=alg))
            for alg in C.ALL_REDUCE_ALGORITHMS}
    runs["barrier"] = C.barrier
    runs["all_gather"] = lambda: C.all_gather([torch.zeros(5) for _ in range(size)], torch.ones(5))
    runs["reduce_scatter"] = lambda: C.reduce_scatter(torch.zeros(5), [torch.ones(5)] * size)
    runs["gather"] = lambda: C.gather(torch.ones(5), [torch.zeros(5) for _ in range(size)]
                                      if rank == 0 else None, dst=0)
    orders = {}
    dist.irecv, dist.isend = irecv, isend
    try:
        for name, run in runs.items():
            calls.clear()
            run()
            orders[name] = list(calls)
    finally:
        dist.irecv, dist.isend = real
    return orders


def test_receives_are_posted_before_sends(results):
    """A step that sends and receives posts its irecv first (both directions of
    a link then run at once); roots post all their receives before sending anything."""
    size, res = results
    for rank, r in enumerate(res):
        o = r["orders"]
        for name in ("ring", "barrier", "all_gather", "reduce_scatter"):
            assert [v for v, _ in o[name]] == ["recv", "send"] * (len(o[name]) // 2), (name, o[name])
        expected = {"ring": 4 * (size - 1), "all_gather": 2 * (size - 1), "reduce_scatter": 2 * (size - 1),
                    "barrier": 2 * math.ceil(math.log2(size))}  # two calls per exchange
        assert {name: len(o[name]) for name in expected} == expected
        if size in (2, 4):  # a power of two: every halving-doubling step is an exchange
            verbs = [v for v, _ in o["halving_doubling"]]
            assert verbs == ["recv", "send"] * (len(verbs) // 2), o["halving_doubling"]
        if rank == 0:
            for name in ("naive", "tree", "gather"):
                verbs = [v for v, _ in o[name]]
                assert verbs == sorted(verbs), (name, o[name])  # every "recv" before any "send"


@part("verbose")
def verbose_print(rank, size, rec):
    os.environ["DIST_SGD_VERBOSE"] = "1"
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            C.all_reduce(torch.ones(8))
    finally:
        del os.environ["DIST_SGD_VERBOSE"]
    return out.getvalue()


def test_verbose_prints_every_send_and_receive(results):
    size, res = results
    for rank, r in enumerate(res):
        printed = r["verbose"].splitlines()
        sends = [l for l in printed if re.match(rf"\[rank {rank}\] send -> peer \d+ chunk \d+ \(\d+ bytes\)", l)]
        recvs = [l for l in printed if re.match(rf"\[rank {rank}\] recv <- peer \d+ chunk \d+ \(\d+ bytes\)", l)]
        assert len(sends) == len(recvs) == 2 * (size - 1), printed


@part("barrier")
def barrier_times(rank, size, rec):
    time.sleep(0.2 if rank == size - 1 else 0.0)  # the last rank comes late to the barrier
    entered = time.time()
    C.barrier()
    return entered, time.time()


def test_barrier_waits_for_everyone(results):
    size, res = results
    last_in = max(r["barrier"][0] for r in res)
    assert all(r["barrier"][1] >= last_in for r in res), [r["barrier"] for r in res]


# ---- subgroups (group=, as dist.new_group makes them) ------------------------------------

def subgroups(size):
    """Member lists every rank creates, in one order (new_group is collective): a strided pair
    (ranks 0, 2 at world size 4, data parallel's axis in a 2 x 2 mesh), the last ranks, and
    everyone but rank 0."""
    lists = {2: [[1], [0, 1]], 3: [[0, 2], [1, 2], [1]], 4: [[0, 2], [1, 3], [1, 2, 3], [2, 3]]}
    return lists.get(size, [])


@part("subgroups")
def check_subgroups(rank, size, rec):
    """Every collective on each subgroup against torch's on the same group; ranks outside it
    return at once with their tensors untouched; a root outside the group is a ValueError."""
    out = {"untouched": True, "errors": []}
    for k, members in enumerate(subgroups(size)):
        g = dist.new_group(members)
        if rank not in members:
            x = torch.ones(3)
            C.all_reduce(x, group=g)
            C.broadcast(x, src=members[0], group=g)
            C.all_gather([torch.zeros(3) for _ in members], x, group=g)
            out["untouched"] &= bool((x == 1).all())
            continue
        n = len(members)
        for alg in C.ALL_REDUCE_ALGORITHMS:
            for op_name in ("sum", "max"):
                ours = values((7,), torch.float64, op_name, 100 * k + rank)
                ref = ours.clone()
                dist.all_reduce(ref, op=OPS[op_name], group=g)
                C.all_reduce(ours, op=OPS[op_name], group=g, algorithm=alg)
                rec.same("subgroups", f"{members} all_reduce {alg} {op_name}", ours, ref,
                         op_name == "max", digest=False)
        for root in members:
            ours = values((5,), torch.float32, "sum", 7 * k + rank)
            ref = ours.clone()
            dist.broadcast(ref, src=root, group=g)
            C.broadcast(ours, src=root, group=g)
            rec.same("subgroups", f"{members} broadcast {root}", ours, ref, True, digest=False)
            ours = values((5,), torch.int64, "sum", 9 * k + rank)
            ref = ours.clone()
            mine = ours.clone()
            dist.reduce(ref, dst=root, group=g)
            C.reduce(ours, dst=root, group=g)
            ref = ref if rank == root else mine  # gloo leaves partial sums on the others
            rec.same("subgroups", f"{members} reduce {root}", ours, ref, True, digest=False)
            mine, is_root = torch.full((2,), float(rank)), rank == root
            got, ref = ([torch.zeros(2) for _ in members] if is_root else None for _ in "ab")
            dist.gather(mine, ref, dst=root, group=g)
            C.gather(mine, got, dst=root, group=g)
            if is_root:
                rec.same("subgroups", f"{members} gather {root}", torch.stack(got),
                         torch.stack(ref), True, digest=False)
            pieces = [torch.full((2,), 10.0 * i + root) for i in range(n)] if is_root else None
            got, ref = torch.zeros(2), torch.zeros(2)
            dist.scatter(ref, pieces, src=root, group=g)
            C.scatter(got, pieces, src=root, group=g)
            rec.same("subgroups", f"{members} scatter {root}", got, ref, True, digest=False)
        mine = values((3,), torch.float64, "sum", 11 * k + rank)
        got, ref = [torch.zeros(3, dtype=torch.float64) for _ in members], \
            [torch.zeros(3, dtype=torch.float64) for _ in members]
        dist.all_gather(ref, mine, group=g)
        C.all_gather(got, mine, group=g)
        rec.same("subgroups", f"{members} all_gather", torch.stack(got), torch.stack(ref),
                 True, digest=False)
        inputs = [values((4,), torch.float64, "sum", 13 * k + 5 * rank + i) for i in range(n)]
        got, ref = torch.zeros(4, dtype=torch.float64), torch.zeros(4, dtype=torch.float64)
        dist.reduce_scatter(ref, list(inputs), group=g)
        C.reduce_scatter(got, inputs, group=g)
        rec.same("subgroups", f"{members} reduce_scatter", got, ref, False, digest=False)
        C.barrier(group=g)
        if n > 1:  # the debug switch's size check runs on the group's members only
            os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
            try:
                C.all_reduce(torch.ones(3 + (rank == members[0])), group=g)
            except ValueError as e:
                out["errors"].append(str(e))
            finally:
                del os.environ["TORCH_DISTRIBUTED_DEBUG"]
        outside = [r for r in range(size) if r not in members]
        try:
            C.broadcast(torch.ones(1), src=(outside or [size])[0], group=g)
        except ValueError as e:
            out["errors"].append(str(e))
    return out


def test_collectives_on_subgroups_match_torch(results):
    """Each subgroup's collectives equal torch's on that group; non-members are untouched."""
    size, res = results
    if size == 1:
        pytest.skip("a subgroup needs two ranks or more")
    for rank, r in enumerate(res):
        groups = [m for m in subgroups(size) if rank in m]
        per_group = lambda m: 2 * len(C.ALL_REDUCE_ALGORITHMS) + 4 * len(m) + 2  # noqa: E731
        expected = sum(per_group(m) - (len(m) - 1) for m in groups)  # gather: its root only
        passed([r], "subgroups", expected)
        assert r["subgroups"]["untouched"], f"rank {rank}: a non-member's tensor changed"
        errors = r["subgroups"]["errors"]
        shared = [m for m in groups if len(m) > 1]
        assert len(errors) == len(groups) + len(shared), errors
        assert sum("must be a global rank in the group" in e for e in errors) == len(groups)
        assert sum("every rank must pass a tensor with as many elements" in e and
                   "rank 0: 4 elements, rank 1: 3" in e for e in errors) == len(shared), errors


# ---- bad input ---------------------------------------------------------------------------

@part("errors")
def errors(rank, size, rec):
    """Bad input that every rank passes alike: each raises before sending anything."""
    t = torch.ones(4)
    bad = {
        "algorithm": lambda: C.all_reduce(t, algorithm="butterfly"),
        "op_premul": lambda: C.all_reduce(t, op=dist._make_nccl_premul_sum(2.0)),
        "op_string": lambda: C.reduce(t, op="sum"),
        "band_float": lambda: C.all_reduce(t, op=ReduceOp.BAND),
        "avg_int": lambda: C.reduce(torch.ones(3, dtype=torch.int64), op=ReduceOp.AVG),
        "max_complex": lambda: C.reduce_scatter(torch.ones(1, dtype=torch.complex64),
                                                [torch.ones(1, dtype=torch.complex64)] * size,
                                                op=ReduceOp.MAX),
        "int16": lambda: C.all_reduce(torch.ones(3, dtype=torch.int16)),
        "sparse": lambda: C.all_reduce(torch.eye(3).to_sparse()),
        "not_tensor": lambda: C.all_reduce([1.0, 2.0]),
        "src_range": lambda: C.broadcast(t, src=size),
        "dst_negative": lambda: C.reduce(t, dst=-1),
        "gather_dst": lambda: C.gather(t, None, dst=size + 3),
        "scatter_src": lambda: C.scatter(t, None, src=size),
        "list_length": lambda: C.all_gather([torch.ones(4)] * (size + 1), t),
        "list_shape": lambda: C.all_gather([torch.ones(4)] * (size - 1) + [torch.ones(5)], t),
        "list_dtype": lambda: C.reduce_scatter(t, [torch.ones(4, dtype=torch.float64)] * size),
        "rs_length": lambda: C.reduce_scatter(t, [t] * (size + 2)),
    }
    if size == 1:  # only rank 0 exists, so it is the root: no peer is left waiting
        bad["gather_list_length"] = lambda: C.gather(t, [t, t], dst=0)
        bad["scatter_list_missing"] = lambda: C.scatter(t, None, src=0)
    messages = {}
    for name, call in bad.items():
        try:
            call()
        except Exception as e:  # noqa: BLE001 - the test checks the type
            messages[name] = f"{type(e).__name__}: {e}"
    if size > 1:  # sizes that differ between ranks, caught by torch's own debug switch
        os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
        try:
            for name, call in mismatched(rank, size).items():
                try:
                    call()
                except ValueError as e:
                    messages[f"mismatch_{name}"] = f"ValueError: {e}"
        finally:
            del os.environ["TORCH_DISTRIBUTED_DEBUG"]
    x = torch.arange(5.0) + rank  # the group still works: no stray message was sent
    C.all_reduce(x)
    messages["after"] = x.tolist()
    w = torch.nn.Parameter(torch.full((3,), float(rank)))  # like torch's: fine on parameters
    C.broadcast(w, src=size - 1)
    C.all_reduce(w)
    messages["parameter"] = w.tolist()
    return messages


def mismatched(rank, size):
    """Every collective with one rank's tensor one element longer (rank 1's): under
    TORCH_DISTRIBUTED_DEBUG=DETAIL each must raise on every rank, as torch's do."""
    n = 4 + (rank == 1)  # rank 1 passes 5 elements, the others 4
    root = [torch.ones(4) for _ in range(size)]
    return {"all_reduce": lambda: C.all_reduce(torch.ones(n)),
            "broadcast": lambda: C.broadcast(torch.ones(n), src=0),
            "reduce": lambda: C.reduce(torch.ones(n), dst=0),
            "all_gather": lambda: C.all_gather([torch.ones(n) for _ in range(size)], torch.ones(n)),
            "reduce_scatter": lambda: C.reduce_scatter(torch.ones(n),
                                                       [torch.ones(n) for _ in range(size)]),
            # the root's list matches its own tensor; rank 1's tensor is the odd one
            "scatter": lambda: C.scatter(torch.ones(n), root if rank == 0 else None, src=0),
            "gather": lambda: C.gather(torch.ones(n), root if rank == 0 else None, dst=0)}


def test_bad_input_gets_a_clear_error(results):
    size, res = results
    m = res[0]["errors"]
    wanted = {"algorithm": "naive, tree, ring, halving_doubling, ring_pipelined",
              "op_premul": "PREMUL_SUM", "op_string": "ReduceOp.BXOR",
              "band_float": "TypeError: ReduceOp.BAND is a bitwise op",
              "avg_int": "TypeError: ReduceOp.AVG needs a floating-point",
              "max_complex": "TypeError: ReduceOp.MAX is not defined on complex",
              "int16": "TypeError: cannot reduce torch.int16", "sparse": "TypeError",
              "not_tensor": "must be a torch.Tensor",
              "src_range": f"src must be a rank in 0..{size - 1}", "dst_negative": "dst must be a rank",
              "gather_dst": "dst must be a rank", "scatter_src": "src must be a rank",
              "list_length": f"world size = {size} tensors, got {size + 1}",
              "list_shape": "shape (5,)", "list_dtype": "dtype torch.float64",
              "rs_length": f"got {size + 2}"}
    if size == 1:
        wanted.update(gather_list_length="got 2", scatter_list_missing="got NoneType")
    else:
        for name in ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter",
                     "scatter", "gather"):
            wanted[f"mismatch_{name}"] = f"{name}: every rank must pass a tensor with as many "
            wanted[f"mismatch_{name}"] += "elements of the same dtype; got rank 0: 4 elements, rank 1: 5"
    for name, text in wanted.items():
        assert name in m, f"{name}: no error raised"
        assert text in m[name] and m[name].startswith(("ValueError", "TypeError")), (name, m[name])
    assert m["after"] == (torch.arange(5.0) * size + sum(range(size))).tolist()
    assert m["parameter"] == [float(size * (size - 1))] * 3
    assert all(r["errors"] == m for r in res[1:]), "every rank raises alike"


@part("recorded")  # registered last: what every part before recorded
def recorded(rank, size, rec):
    return {"count": rec.count, "failed": rec.failed, "digests": rec.digests}


def _cuda_cases(rank, size):
    """GPU tensors over NCCL: every algorithm and the ring's phases against torch's."""
    dev, failed = torch.device("cuda", rank), []
    for n in (0, 3, 1001):
        x = torch.randn(n, generator=torch.Generator().manual_seed(rank)).to(dev)
        for alg in C.ALL_REDUCE_ALGORITHMS:
            ref, ours = x.clone(), x.clone()
            dist.all_reduce(ref)
            C.all_reduce(ours, algorithm=alg)
            failed += [] if torch.allclose(ours, ref, atol=1e-5) else [f"all_reduce/{alg}/{n}"]
        ref, ours = [torch.empty_like(x) for _ in range(size)], [torch.empty_like(x) for _ in range(size)]
        dist.all_gather(ref, x)
        C.all_gather(ours, x)
        failed += [] if torch.equal(torch.stack(ours), torch.stack(ref)) else [f"all_gather/{n}"]
        ref, ours = x.clone(), x.clone()
        dist.broadcast(ref, src=size - 1)
        C.broadcast(ours, src=size - 1)
        failed += [] if torch.equal(ours, ref) else [f"broadcast/{n}"]
    C.barrier()
    return failed


@pytest.mark.skipif(torch.cuda.device_count() < 2 or not dist.is_nccl_available(),
                    reason="needs 2 GPUs and NCCL")
def test_cuda_tensors_over_nccl():
    assert launch(_cuda_cases, 2, backend="nccl") == [[], []]
