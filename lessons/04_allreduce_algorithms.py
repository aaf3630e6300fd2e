"""Lesson 04: four ways to all-reduce, the ring step by step, and what each one costs.

all_reduce is the one collective data-parallel training cannot do without: after every
backward pass, every rank needs the sum of every rank's gradients. There are many ways to
compute it from send/recv; dist_sgd.allreduce has four, all checked here against torch:

    naive             everyone sends its whole tensor to rank 0, which adds them up and sends
                      the sum back to everyone. Rank 0 moves 2(p-1) tensors; the rest wait.
    tree              a binomial tree: pairs add up, then pairs of pairs...: log2(p) rounds
                      to rank 0, and the same tree backwards to broadcast. Still whole tensors.
    ring              cut the tensor into p chunks. Reduce-scatter: p-1 steps, in each every
                      rank passes one chunk to its right neighbour, which adds it to its own;
                      after them rank r holds chunk r summed over all ranks. All-gather: p-1
                      more steps pass the finished chunks around. Every message is ~n/p: each
                      rank sends 2(p-1)/p n bytes in total, nearly 2n whatever p is: the
                      least any all-reduce can do (the PyTorch tutorial's "ring" passes the
                      whole tensor around instead, p times more bytes).
    halving_doubling  Rabenseifner: partners 1, 2, 4... apart swap halves, quarters... The
                      ring's bytes in log2(p) steps instead of p-1. Non-powers of two: the
                      extra ranks first fold their tensor into a partner and get the result
                      back at the end.

The alpha-beta model prices a message of n bytes at alpha + n beta (latency + bytes over
bandwidth; gamma per byte added):
    naive   2(p-1)(alpha + n beta)              tree             2 log2(p) (alpha + n beta)
    ring    2(p-1) alpha + 2(p-1)/p n beta      halving_doubling 2 log2(p) alpha + 2(p-1)/p n beta
So the tree wins for small messages (few latencies), the ring and halving-doubling for large
ones (few bytes). The lesson measures alpha and beta with a ping-pong (lesson 02), predicts
each algorithm's time with dist_sgd.costmodel and puts the measured times beside them.

Honest caveat: on one machine the "network" is memory copies through the kernel's loopback
TCP, and with more ranks than cores the ranks also queue for a CPU, which the model ignores.

It also prints the ring's trace on a tiny tensor (which chunk goes where at each step, from
the `trace` list every rank fills) and draws it as an animation: figures/ring_allreduce.gif
(with --quick it goes to the temp directory instead, so smoke tests leave figures/ alone).

Run (from the repository root):
    python lessons/04_allreduce_algorithms.py --world-size 4
    torchrun --standalone --nproc-per-node 4 lessons/04_allreduce_algorithms.py
    DIST_SGD_VERBOSE=1 python lessons/04_allreduce_algorithms.py --world-size 3 --quick

Exercises:
  1. From the trace, count the bytes rank 0 sends with each algorithm at p = 2, 3, 4, 8.
     Which algorithm's busiest rank sends the most, and how does that grow with p?
  2. Where is the crossover between tree and ring in the model (solve for n)? Do the
     measured times agree? Try --world-size 3 and 4.
  3. Pass the whole tensor around the ring (the tutorial's version) and time it against
     ours at 16 MiB. How far apart are they at p = 4, and what does the model say?
  4. Why does every rank end with bitwise identical bytes with the ring, even though float
     addition is not associative? (Hint: who adds up each chunk?)
"""
import hashlib
import os
import statistics
import sys
import tempfile

import torch
import torch.distributed as dist

from dist_sgd import costmodel, ringviz  # noqa: E402
from dist_sgd.collectives import ALL_REDUCE_ALGORITHMS, all_reduce  # noqa: E402
from dist_sgd.launch import device, launch, lesson_parser, log  # noqa: E402
from dist_sgd.p2p import ping_pong  # noqa: E402
from dist_sgd.timing import time_alternating  # noqa: E402


def everyone(obj):
    """Every rank's obj, in rank order (torch's all_gather_object: any picklable thing)."""
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def check_algorithms(rank, size, n):
    log(f"\n1. the four algorithms on {n:,} random float32 numbers per rank, against torch")
    log(f"   {'algorithm':17s} {'max diff':>9s}  {'ranks agree':>11s}  {'messages':>8s}  "
        f"{'kB sent by the busiest rank':>27s}")
    x = torch.randn(n, generator=torch.Generator().manual_seed(rank)).to(device())
    expected = x.clone()
    dist.all_reduce(expected)
    worst = 0.0
    for alg in ALL_REDUCE_ALGORITHMS:
        got, trace = x.clone(), []
        all_reduce(got, algorithm=alg, trace=trace)
        torch.testing.assert_close(got, expected)
        diff = torch.tensor([(got - expected).abs().max().item()], dtype=torch.float64, device=device())
        dist.all_reduce(diff, op=dist.ReduceOp.MAX)
        digest = hashlib.sha1(got.cpu().numpy().tobytes()).hexdigest()
        stats = everyone((digest, len(trace), sum(m["nbytes"] for m in trace)))
        agree = len({d for d, _, _ in stats}) == 1
        assert agree, f"{alg}: ranks ended with different bytes"
        worst = max(worst, diff.item())
        log(f"   {alg:17s} {diff.item():9.2g}  {'yes' if agree else 'NO':>11s}  "
            f"{max(m for _, m, _ in stats):8d}  {max(b for _, _, b in stats) / 1e3:27.1f}")
    log(f"   (max diff: float sums in another order differ in the last bits; a tensor is "
        f"{4 * n / 1e3:.1f} kB; messages over 1 MiB travel as 1 MiB segments)")
    return worst


def show_ring(rank, size, gif_path):
    n = 2 * size
    log(f"\n2. the ring, step by step, on a tiny tensor of {n} float32 numbers ({size} chunks "
        f"of 2): chunk cK, 'a+b' = holds the sum of ranks a and b's data")
    trace = []
    all_reduce(torch.ones(n, device=device()), trace=trace)
    traces = everyone(trace)
    if rank != 0:
        return
    everything = [m for t in traces for m in t]
    assert all(m["numel"] <= -(-n // size) for m in everything), "the ring sent more than a chunk"
    for line in ringviz.table(everything, size):
        log("   " + line)
    if size > 1:
        ringviz.draw_gif(everything, size, gif_path)
        log(f"   drawn as an animation: {gif_path} ({os.path.getsize(gif_path) / 1e3:.0f} kB)")


def costs(rank, size, quick):
    log("\n3. the alpha-beta model against measured times")
    if size < 2:
        log("   (one rank sends nothing: run with --world-size 2 or more)")
        return
    rows = ping_pong([8, 1 << 16, 1 << 20] if quick else [8, 1 << 12, 1 << 16, 1 << 20, 1 << 23],
                     repeats=3 if quick else 10)
    alpha, beta = costmodel.fit_alpha_beta([r["bytes"] for r in rows], [r["seconds"] for r in rows])
    a, b = torch.rand(1 << 20, device=device()), torch.rand(1 << 20, device=device())
    add = time_alternating({"add": lambda: a.add_(b)}, repeats=5, warmup=1)["add"]
    gamma = statistics.median(add) / a.nbytes
    log(f"   ping-pong between ranks 0 and 1: alpha = {alpha * 1e6:.1f} us per message, "
        f"1/beta = {1 / beta / 1e9:.2f} GB/s; adding: 1/gamma = {1 / gamma / 1e9:.2f} GB/s")
    sizes = [1 << 16, 1 << 20] if quick else [1 << 14, 1 << 18, 1 << 22, 1 << 24]
    log(f"   {'size':>8s}  {'algorithm':17s} {'predicted':>10s} {'measured':>10s}  measured/predicted")
    for nbytes in sizes:
        bufs = {alg: torch.rand(nbytes // 4, device=device()) for alg in ALL_REDUCE_ALGORITHMS + ("torch",)}
        runs = {alg: (lambda t=bufs[alg], alg=alg: all_reduce(t, algorithm=alg)) for alg in ALL_REDUCE_ALGORITHMS}
        runs["torch"] = lambda t=bufs["torch"]: dist.all_reduce(t)
        # Interleaved (A B C ... A B C ...) with medians: load bursts hit every candidate alike.
        times = time_alternating(runs, repeats=3 if quick else 10, warmup=1)
        for alg in ALL_REDUCE_ALGORITHMS + ("torch",):
            measured = statistics.median(times[alg])
            if alg == "torch":
                log(f"   {'':8s}  {'torch (' + dist.get_backend() + ')':17s} {'':>10s} {measured * 1e3:8.2f}ms")
                continue
            predicted = costmodel.predict_all_reduce(alg, nbytes, size, alpha, beta, gamma)
            log(f"   {nbytes / 2**20:6.3g}MB  {alg:17s} {predicted * 1e3:8.2f}ms {measured * 1e3:8.2f}ms"
                f"  {measured / predicted:6.2f}")
    log("   Reading it: small messages pay latencies (tree and halving-doubling take fewer steps),")
    log("   large ones pay bytes (ring and halving-doubling send ~2n per rank, naive's root 2(p-1)n).")
    log("   Off by more than the model says? Here the 'network' is memory copies over loopback on")
    log("   one machine: every byte sent is copied by a CPU, and the ping-pong measured one pair")
    log("   with the machine otherwise idle.")
    cores = os.cpu_count() or 1
    if size > cores:
        log(f"   Here {size} ranks share {cores} cores: the ranks' copies cannot all run at once, so")
        log(f"   expect the bandwidth-bound times to be ~{size / cores:.0f}x the model, and every step")
        log("   to wait for a free CPU (latency). A real cluster gives each rank its own link.")


def lesson(rank, size, quick, gif_path):
    log(f"{size} ranks, backend {dist.get_backend()}; algorithms: {', '.join(ALL_REDUCE_ALGORITHMS)}")
    worst = check_algorithms(rank, size, 1001 if quick else 1 << 20)
    show_ring(rank, size, gif_path)
    costs(rank, size, quick)
    log(f"\nevery algorithm matches torch.distributed.all_reduce: max difference {worst:.3g}")


def main():
    args = lesson_parser(__doc__, world_size=4).parse_args()
    if args.quick:  # smoke tests and the quick tour must not touch the committed figure
        gif = os.path.join(tempfile.gettempdir(), "ring_allreduce.gif")
    else:
        from dist_sgd.bench.common import figure_path
        gif = figure_path("ring_allreduce.gif")
    launch(lesson, args.world_size, args.quick, gif, backend=args.backend)


if __name__ == "__main__":
    main()
