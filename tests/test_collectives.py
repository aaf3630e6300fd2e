"""dist_sgd.collectives against torch.distributed (gloo), on the same inputs, at world sizes 1-4.

One launch() per world size runs every case inside the ranks (a spawn costs seconds): each
collective, each all-reduce algorithm and reduce op, float32/float64/int64, and the awkward
tensors (empty, 0-d, one element, fewer elements than ranks, odd sizes, non-contiguous
views). Each rank compares ours with torch's with torch.testing.assert_close (exactly for
integers, MIN and MAX) and raises on a difference; the parent then checks what only it can
see: every rank ended with the same bytes, the error messages, the ring's trace.
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

from dist_sgd import allreduce, collectives as C, wire
from dist_sgd.launch import launch

OPS = {"sum": ReduceOp.SUM, "product": ReduceOp.PRODUCT, "min": ReduceOp.MIN, "max": ReduceOp.MAX}
DTYPES = (torch.float32, torch.float64, torch.int64)
# name -> (shape of the tensor passed in, how it is laid out)
KINDS = {"0-d": ((), "contiguous"), "empty": ((0,), "contiguous"), "one": ((1,), "contiguous"),
         "three": ((3,), "contiguous"),  # fewer elements than ranks at world size 4
         "seven": ((7,), "contiguous"), "1001": ((1001,), "contiguous"),
         "matrix": ((3, 5), "contiguous"), "transposed": ((5, 3), "transposed"),
         "strided": ((33,), "strided")}


def values(shape, dtype, op, seed):
    """Inputs that keep every op exact enough: PRODUCT gets values near 1 (floats) or in
    -2..2 (ints), so four ranks neither overflow nor underflow."""
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        if op == "product":
            return (0.9 + 0.2 * torch.rand(shape, generator=g, dtype=torch.float64)).to(dtype)
        return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    low, high = (-2, 3) if op == "product" else (-50, 51)
    return torch.randint(low, high, shape, generator=g, dtype=dtype)


def make(kind, dtype, op, seed, device="cpu"):
    """(the tensor to pass, its base when it is a view into a bigger tensor, else None)."""
    shape, layout = KINDS[kind]
    if layout == "transposed":
        base = values(shape[::-1], dtype, op, seed).to(device)
        return base.t(), base
    if layout == "strided":
        base = values((2 * shape[0],), dtype, op, seed).to(device)
        return base[::2], base
    return values(shape, dtype, op, seed).to(device), None


def check(got, expected, exact):
    torch.testing.assert_close(got.cpu(), expected.cpu(), **({"rtol": 0, "atol": 0} if exact else {}))


def digest(t):
    return hashlib.sha1(t.detach().cpu().contiguous().numpy().tobytes()).hexdigest()


class Checker:
    """Counts checks (a run that silently checks nothing must fail) and collects digests."""

    def __init__(self):
        self.count, self.digests = 0, {}

    def same(self, name, got, expected, exact):
        check(got, expected, exact)
        self.digests[name] = digest(got)
        self.count += 1


def check_all_reduce(ck, rank, size, device="cpu"):
    for alg in C.ALL_REDUCE_ALGORITHMS:
        for op_name, op in OPS.items():
            for dtype in DTYPES:
                for i, kind in enumerate(KINDS):
                    seed = 1000 * i + 10 * rank
                    ours, base = make(kind, dtype, op_name, seed, device)
                    ref = ours.contiguous().clone()
                    dist.all_reduce(ref, op=op)
                    untouched = base[1::2].clone() if KINDS[kind][1] == "strided" else None
                    C.all_reduce(ours, op=op, algorithm=alg)
                    exact = not dtype.is_floating_point or op_name in ("min", "max")
                    ck.same(f"all_reduce/{alg}/{op_name}/{dtype}/{kind}", ours, ref, exact)
                    if untouched is not None:  # a strided view: the gaps must stay as they were
                        check(base[1::2], untouched, exact=True)


def check_rooted(ck, rank, size, device="cpu"):
    """broadcast, reduce, gather, scatter: every root, every kind; reduce with every op."""
    for root in range(size):
        for dtype in DTYPES:
            for i, kind in enumerate(KINDS):
                seed = 7 + 1000 * i + 10 * rank
                ours, _ = make(kind, dtype, "sum", seed, device)
                ref = ours.contiguous().clone()
                dist.broadcast(ref, src=root)
                C.broadcast(ours, src=root)
                ck.same(f"broadcast/{root}/{dtype}/{kind}", ours, ref, exact=True)

                # Every op at one root (the last: not 0, the tree's favourite), SUM at the others.
                for op_name, op in OPS.items() if root == size - 1 else [("sum", ReduceOp.SUM)]:
                    ours, _ = make(kind, dtype, op_name, seed, device)
                    before, ref = ours.clone(), ours.contiguous().clone()
                    dist.reduce(ref, dst=root, op=op)
                    C.reduce(ours, dst=root, op=op)
                    exact = not dtype.is_floating_point or op_name in ("min", "max")
                    if rank == root:
                        check(ours, ref, exact)
                    else:  # torch leaves it undefined (gloo changes it); ours leaves it alone
                        check(ours, before, exact=True)
                    ck.count += 1

                mine, _ = make(kind, dtype, "sum", seed, device)
                if rank == root:
                    ref_list = [torch.zeros_like(mine).contiguous() for _ in range(size)]
                    ours_list = [make(kind, dtype, "sum", 99991, device)[0].zero_() for _ in range(size)]
                else:
                    ref_list = ours_list = None
                dist.gather(mine.contiguous(), ref_list, dst=root)
                C.gather(mine, ours_list, dst=root)
                if rank == root:
                    for j in range(size):
                        check(ours_list[j], ref_list[j], exact=True)
                ck.count += 1

                pieces = [make(kind, dtype, "sum", seed + 1 + j, device)[0] for j in range(size)]
                ref, ours = torch.zeros_like(mine).contiguous(), make(kind, dtype, "sum", 99991, device)[0]
                dist.scatter(ref, [p.contiguous() for p in pieces] if rank == root else None, src=root)
                C.scatter(ours, pieces if rank == root else None, src=root)
                ck.same(f"scatter/{root}/{dtype}/{kind}/{rank}", ours, ref, exact=True)
                ck.digests.pop(f"scatter/{root}/{dtype}/{kind}/{rank}")  # differs by rank


def check_all_to_all(ck, rank, size, device="cpu"):
    """all_gather and reduce_scatter: lists of awkward tensors, inputs left unchanged."""
    for dtype in DTYPES:
        for i, kind in enumerate(KINDS):
            seed = 13 + 1000 * i + 10 * rank
            mine, _ = make(kind, dtype, "sum", seed, device)
            ref_list = [torch.zeros_like(mine).contiguous() for _ in range(size)]
            ours_list = [make(kind, dtype, "sum", 99991, device)[0].zero_() for _ in range(size)]
            dist.all_gather(ref_list, mine.contiguous())
            C.all_gather(ours_list, mine)
            for j in range(size):
                ck.same(f"all_gather/{dtype}/{kind}/{j}", ours_list[j], ref_list[j], exact=True)

            for op_name, op in OPS.items():
                inputs = [make(kind, dtype, op_name, seed + j, device)[0] for j in range(size)]
                saved = [t.clone() for t in inputs]
                ref, ours = torch.zeros_like(mine).contiguous(), make(kind, dtype, "sum", 99991, device)[0]
                dist.reduce_scatter(ref, [t.contiguous() for t in inputs], op=op)
                C.reduce_scatter(ours, inputs, op=op)
                exact = not dtype.is_floating_point or op_name in ("min", "max")
                check(ours, ref, exact)
                for t, s in zip(inputs, saved):
                    check(t, s, exact=True)
                ck.count += 1


def check_pipeline(ck, rank, size):
    """Tiny segments and window: many segments per message, receive buffers reposted, and
    every collective's sender and receiver must cut messages alike."""
    old = wire.SEGMENT_BYTES, wire.WINDOW
    wire.SEGMENT_BYTES, wire.WINDOW = 16, 2  # 4 float32 per segment
    try:
        check_all_reduce_some(ck, rank, 203, "pipelined")
        check_every_collective(ck, rank, size, 101)
    finally:
        wire.SEGMENT_BYTES, wire.WINDOW = old
    # The real segment size: messages of 1.2 MB, more than one segment each.
    check_all_reduce_some(ck, rank, 300_000 * size + 3, "big", ops=("sum",))
    check_every_collective(ck, rank, size, 300_001)


def check_every_collective(ck, rank, size, n):
    mine = values((n,), torch.float32, "sum", rank)
    root = size - 1
    ref, ours = mine.clone(), mine.clone()
    dist.broadcast(ref, src=root)
    C.broadcast(ours, src=root)
    check(ours, ref, exact=True)
    ref, ours = mine.clone(), mine.clone()
    dist.reduce(ref, dst=root)
    C.reduce(ours, dst=root)
    check(ours, ref if rank == root else mine, exact=rank != root)
    ref_list = [torch.empty_like(mine) for _ in range(size)] if rank == root else None
    ours_list = [torch.empty_like(mine) for _ in range(size)] if rank == root else None
    dist.gather(mine, ref_list, dst=root)
    C.gather(mine, ours_list, dst=root)
    if rank == root:
        check(torch.stack(ours_list), torch.stack(ref_list), exact=True)
    pieces = [values((n,), torch.float32, "sum", 10 * rank + j) for j in range(size)]
    ref, ours = torch.empty_like(mine), torch.empty_like(mine)
    dist.scatter(ref, pieces if rank == root else None, src=root)
    C.scatter(ours, pieces if rank == root else None, src=root)
    check(ours, ref, exact=True)
    ref_list, ours_list = [torch.empty_like(mine) for _ in range(size)], [torch.empty_like(mine) for _ in range(size)]
    dist.all_gather(ref_list, mine)
    C.all_gather(ours_list, mine)
    check(torch.stack(ours_list), torch.stack(ref_list), exact=True)
    ref, ours = torch.empty_like(mine), torch.empty_like(mine)
    dist.reduce_scatter(ref, pieces)
    C.reduce_scatter(ours, pieces)
    check(ours, ref, exact=False)
    ck.count += 1


def check_all_reduce_some(ck, rank, n, label, ops=("sum", "max")):
    for alg in C.ALL_REDUCE_ALGORITHMS:
        for op_name in ops:
            x = values((n,), torch.float32, op_name, 31 * rank + 1)
            ref = x.clone()
            dist.all_reduce(ref, op=OPS[op_name])
            C.all_reduce(x, op=OPS[op_name], algorithm=alg)
            ck.same(f"{label}/{alg}/{op_name}", x, ref, exact=op_name == "max")


def ring_traces(rank, size):
    """The ring's trace for a few sizes, and the verbose print of one all-reduce."""
    traces = {}
    for n in (0, 1, 3, 7, 1001):
        traces[n] = []
        C.all_reduce(torch.ones(n), trace=traces[n])
    others = {}
    for alg in C.ALL_REDUCE_ALGORITHMS:
        others[alg] = []
        C.all_reduce(torch.ones(10), algorithm=alg, trace=others[alg])
    os.environ["DIST_SGD_VERBOSE"] = "1"
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            C.all_reduce(torch.ones(8))
    finally:
        del os.environ["DIST_SGD_VERBOSE"]
    return traces, others, out.getvalue()


def errors(rank, size):
    """Bad input that every rank passes alike: each raises before sending anything."""
    t = torch.ones(4)
    bad = {
        "algorithm": lambda: C.all_reduce(t, algorithm="butterfly"),
        "op_avg": lambda: C.all_reduce(t, op=ReduceOp.AVG),
        "op_string": lambda: C.reduce(t, op="sum"),
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
        except (ValueError, TypeError) as e:
            messages[name] = f"{type(e).__name__}: {e}"
    x = torch.arange(5.0) + rank  # the group still works: no stray message was sent
    C.all_reduce(x)
    check(x, torch.arange(5.0) * size + sum(range(size)), exact=True)
    w = torch.nn.Parameter(torch.full((3,), float(rank)))  # like torch's: fine on parameters
    C.broadcast(w, src=size - 1)
    C.all_reduce(w)
    check(w.detach(), torch.full((3,), float(size * (size - 1))), exact=True)
    return messages


def run_all(rank, size):
    ck = Checker()
    check_all_reduce(ck, rank, size)
    check_rooted(ck, rank, size)
    check_all_to_all(ck, rank, size)
    check_pipeline(ck, rank, size)
    delay = 0.2 if rank == size - 1 else 0.0  # the last rank comes late to the barrier
    time.sleep(delay)
    entered = time.time()
    C.barrier()
    left = time.time()
    return {"count": ck.count, "digests": ck.digests, "traces": ring_traces(rank, size),
            "errors": errors(rank, size), "barrier": (entered, left)}


@pytest.fixture(scope="module", params=[1, 2, 3, 4])
def results(request):
    return request.param, launch(run_all, request.param)


def expected_count(size):
    kinds, ops, algs = len(KINDS), len(OPS), len(C.ALL_REDUCE_ALGORITHMS)
    per_dtype = kinds * (ops * algs + size * 4 + ops - 1 + size + ops)
    return len(DTYPES) * per_dtype + 3 * algs + 2


def test_matches_torch_and_ranks_agree(results):
    size, res = results
    for r in res:  # every rank ran every check (each raised on its own if one failed)
        assert r["count"] == expected_count(size), (r["count"], expected_count(size))
    first = res[0]["digests"]
    kinds, algs = len(KINDS), len(C.ALL_REDUCE_ALGORITHMS)
    assert len(first) == len(DTYPES) * kinds * (len(OPS) * algs + 2 * size) + 3 * algs
    for r, other in enumerate(res[1:], start=1):
        differ = [k for k in first if other["digests"][k] != first[k]]
        assert not differ, f"rank {r} ended with different bytes than rank 0 in {differ[:5]}"


def test_barrier_waits_for_everyone(results):
    size, res = results
    last_in = max(r["barrier"][0] for r in res)
    assert all(r["barrier"][1] >= last_in for r in res), [r["barrier"] for r in res]


def test_ring_sends_chunks_not_the_whole_tensor(results):
    size, res = results
    for rank, r in enumerate(res):
        traces, others, _ = r["traces"]
        for n, trace in traces.items():
            offsets = allreduce.split(n, size)
            chunk = [offsets[i + 1] - offsets[i] for i in range(size)]
            assert all(0 < m["numel"] <= math.ceil(n / size) for m in trace), trace
            # Reduce-scatter: send every chunk but my own; all-gather: every chunk but the next.
            expected = [("reduce-scatter", s, (rank - s - 1) % size) for s in range(size - 1)]
            expected += [("all-gather", s, (rank - s) % size) for s in range(size - 1)]
            expected = [e for e in expected if chunk[e[2]] > 0]  # empty chunks are not sent
            assert [(m["phase"], m["step"], m["chunk"]) for m in trace] == expected, trace
            assert all(m["src"] == rank and m["dst"] == (rank + 1) % size for m in trace)
            assert sum(m["nbytes"] for m in trace) == 4 * (2 * n - chunk[rank] - chunk[(rank + 1) % size])
        for alg, trace in others.items():
            assert (len(trace) > 0) == (size > 1), (alg, trace)
            for m in trace:
                assert set(m) == {"algorithm", "phase", "step", "src", "dst", "chunk", "numel", "nbytes"}
                assert m["algorithm"] == alg and m["src"] == rank and m["dst"] != rank
                assert m["nbytes"] == 4 * m["numel"] > 0


def test_verbose_prints_every_send_and_receive(results):
    size, res = results
    for rank, r in enumerate(res):
        printed = r["traces"][2].splitlines()
        sends = [l for l in printed if re.match(rf"\[rank {rank}\] send -> peer \d+ chunk \d+ \(\d+ bytes\)", l)]
        recvs = [l for l in printed if re.match(rf"\[rank {rank}\] recv <- peer \d+ chunk \d+ \(\d+ bytes\)", l)]
        assert len(sends) == len(recvs) == 2 * (size - 1), printed


def test_bad_input_gets_a_clear_error(results):
    size, res = results
    m = res[0]["errors"]
    wanted = {"algorithm": "naive, tree, ring, halving_doubling", "op_avg": "ReduceOp.SUM",
              "op_string": "ReduceOp.MAX", "not_tensor": "must be a torch.Tensor",
              "src_range": f"src must be a rank in 0..{size - 1}", "dst_negative": "dst must be a rank",
              "gather_dst": "dst must be a rank", "scatter_src": "src must be a rank",
              "list_length": f"world size = {size} tensors, got {size + 1}",
              "list_shape": "shape (5,)", "list_dtype": "dtype torch.float64",
              "rs_length": f"got {size + 2}"}
    if size == 1:
        wanted.update(gather_list_length="got 2", scatter_list_missing="got NoneType")
        wanted["list_shape"] = "shape (5,)"
    for name, text in wanted.items():
        assert name in m, f"{name}: no error raised"
        assert text in m[name], (name, m[name])
    assert all(r["errors"] == m for r in res)


def _cuda_cases(rank, size):
    ck = Checker()
    device = torch.device("cuda", rank)
    check_all_reduce(ck, rank, size, device)
    check_rooted(ck, rank, size, device)
    check_all_to_all(ck, rank, size, device)
    C.barrier()
    return ck.count


@pytest.mark.skipif(torch.cuda.device_count() < 2 or not dist.is_nccl_available(),
                    reason="needs 2 GPUs and NCCL")
def test_cuda_tensors_over_nccl():
    counts = launch(_cuda_cases, 2, backend="nccl")
    assert counts[0] == counts[1] == expected_count(2) - 3 * len(C.ALL_REDUCE_ALGORITHMS) - 2
