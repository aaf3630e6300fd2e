"""Lesson 04: four ways to all-reduce, the ring step by step, and what each one costs.

all_reduce is the one collective data-parallel training cannot do without: after every
backward pass, every rank needs the sum of every rank's gradients. There are many ways to
compute it from send/recv; dist_sgd.comm.allreduce has four textbook ones, checked here
against torch (and "ring_pipelined", the ring tuned for big tensors, see ring_pipelined.py):

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
each algorithm's time with dist_sgd.scale.costmodel and puts the measured times beside them.

Honest caveat: on one machine the "network" is memory copies through the kernel's loopback
TCP, and with more ranks than cores the ranks also queue for a CPU, which the model ignores:
here every algorithm is bound by Python and the scheduler more than by its shape.

It starts with the ring's trace on a tiny tensor (which chunk goes where at each step, from
the `trace` list every rank fills), drawn as an animated GIF in a temporary directory
(--save-figures: figures/ring_allreduce.gif). With DIST_SGD_VERBOSE=1 every message of that
small ring is printed right above its table; the measurements run first, so their messages
come before every table.

Run (from the repository root):
    python lessons/04_allreduce_algorithms.py --world-size 4
    torchrun --standalone --nproc-per-node 4 lessons/04_allreduce_algorithms.py
    DIST_SGD_VERBOSE=1 python lessons/04_allreduce_algorithms.py --world-size 3 --quick
    python lessons/04_allreduce_algorithms.py --world-size 4 --save-figures   # the GIF

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
import tempfile

import torch
import torch.distributed as dist

from dist_sgd.scale import costmodel
from dist_sgd.comm import ringviz
from dist_sgd.plumbing.check import check, max_diff
from dist_sgd.comm.collectives import ALL_REDUCE_ALGORITHMS, all_reduce
from dist_sgd.plumbing.launch import launch, lesson_parser
from dist_sgd.plumbing.rank import device, log
from dist_sgd.comm.p2p import ping_pong
from dist_sgd.plumbing.timing import time_alternating


def everyone(obj):
    """Every rank's obj, in rank order (torch's all_gather_object: any picklable thing)."""
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def show_ring(rank, size, gif_path):
    """The ring on a tiny tensor: every message from the trace, and who holds what."""
    n = 2 * size
    log(f"\n1. the ring, step by step, on {n} float32 numbers ({size} chunks of 2): chunk cK; "
        "'a+b' = holds the sum of ranks a and b's data")
    trace = []
    all_reduce(torch.ones(n, device=device()), trace=trace)
    traces = everyone(trace)
    everything = [m for t in traces for m in t]
    for line in ringviz.table(everything, size):
        log("   " + line)
    most = max(len(t) for t in traces)
    log(check(f"ring: messages per rank ({most}) vs 2(p-1) = {2 * (size - 1)}", abs(most - 2 * (size - 1)), 0))
    biggest = max([m["numel"] for m in everything], default=0)
    log(check(f"ring: largest message ({biggest} numbers) beyond ceil(n/p) = {-(-n // size)}",
              max(0, biggest - -(-n // size)), 0))
    if size > 1 and rank == 0:
        ringviz.draw_gif(everything, size, gif_path)
        log(f"   drawn as an animation: {gif_path} ({os.path.getsize(gif_path) / 1e3:.0f} kB)")


def check_algorithms(rank, size, n):
    """Every algorithm against torch on the same random input; returns the table's rows."""
    x = torch.randn(n, generator=torch.Generator().manual_seed(rank)).to(device())
    expected = x.clone()
    dist.all_reduce(expected)
    rows = []
    for alg in ALL_REDUCE_ALGORITHMS:
        got, trace = x.clone(), []
        all_reduce(got, algorithm=alg, trace=trace)
        digest = hashlib.sha1(got.cpu().numpy().tobytes()).hexdigest()
        stats = everyone((max_diff(got, expected), digest, len(trace), sum(m["nbytes"] for m in trace)))
        rows.append((alg, max(d for d, _, _, _ in stats), len({h for _, h, _, _ in stats}),
                     max(m for _, _, m, _ in stats), max(b for _, _, _, b in stats)))
    return rows


def measure_costs(size, quick):
    """Fit alpha and beta with a ping-pong, gamma by timing an add; time every algorithm."""
    rows = ping_pong([8, 1 << 16, 1 << 20] if quick else [8, 1 << 12, 1 << 16, 1 << 20, 1 << 23],
                     repeats=3 if quick else 10)
    alpha, beta = costmodel.fit_alpha_beta([r["bytes"] for r in rows], [r["seconds"] for r in rows])
    a, b = torch.rand(1 << 20, device=device()), torch.rand(1 << 20, device=device())
    gamma = statistics.median(time_alternating({"add": lambda: a.add_(b)}, repeats=5, warmup=1)["add"]) / a.nbytes
    times = {}
    for nbytes in [1 << 16, 1 << 20] if quick else [1 << 14, 1 << 18, 1 << 22, 1 << 24]:
        bufs = {alg: torch.rand(nbytes // 4, device=device()) for alg in ALL_REDUCE_ALGORITHMS + ("torch",)}
        runs = {alg: (lambda t=bufs[alg], alg=alg: all_reduce(t, algorithm=alg)) for alg in ALL_REDUCE_ALGORITHMS}
        runs["torch"] = lambda t=bufs["torch"]: dist.all_reduce(t)
        # Interleaved (A B C ... A B C ...) with medians: load bursts hit every candidate alike.
        samples = time_alternating(runs, repeats=3 if quick else 10, warmup=1)
        times[nbytes] = {alg: statistics.median(s) for alg, s in samples.items()}
    return alpha, beta, gamma, times


def report(size, n, rows, costs):
    log(f"\n2. every algorithm on {n:,} random float32 numbers per rank, against torch")
    log(f"   {'algorithm':16s} {'ranks with the same bytes':>26s}  {'messages':>8s}  {'kB sent by the busiest rank':>27s}")
    for alg, diff, digests, messages, nbytes in rows:
        log(f"   {alg:16s} {size if digests == 1 else 'NO':>26}  {messages:8d}  {nbytes / 1e3:27.1f}")
    for alg, diff, digests, messages, nbytes in rows:
        log(check(f"all_reduce ({alg}) vs torch, all ranks", diff, 1e-5))
    log(f"   (float sums in another order differ in the last bits; a tensor is {4 * n / 1e3:.1f} kB)")
    log("\n3. the alpha-beta model against measured times")
    if costs is None:
        log("   (one rank sends nothing: run with --world-size 2 or more)")
        return
    alpha, beta, gamma, times = costs
    log(f"   ping-pong between ranks 0 and 1: alpha = {alpha * 1e6:.1f} us per message, "
        f"1/beta = {1 / beta / 1e9:.2f} GB/s; adding: 1/gamma = {1 / gamma / 1e9:.2f} GB/s")
    log(f"   {'size':>8s}  {'algorithm':16s} {'predicted':>10s} {'measured':>10s}  measured/predicted")
    for nbytes, measured in times.items():
        for alg in ALL_REDUCE_ALGORITHMS:
            predicted = costmodel.predict_all_reduce(alg, nbytes, size, alpha, beta, gamma)
            log(f"   {nbytes / 2**20:6.3g}MB  {alg:16s} {predicted * 1e3:8.2f}ms {measured[alg] * 1e3:8.2f}ms"
                f"  {measured[alg] / predicted:6.2f}")
        log(f"   {'':8s}  {'torch (' + dist.get_backend() + ')':16s} {'':>10s} {measured['torch'] * 1e3:8.2f}ms")
    log("   Reading it: small messages pay latencies (tree and halving-doubling take fewer steps),\n"
        "   large ones pay bytes (ring and halving-doubling send ~2n per rank, naive's root 2(p-1)n).\n"
        "   Here the 'network' is memory copies over loopback: every byte sent is copied by a CPU,\n"
        "   and the ping-pong timed one pair of ranks while the others waited.")
    if size > (os.cpu_count() or 1):
        log(f"   Here {size} ranks share {os.cpu_count()} cores: their copies cannot all run at once, and\n"
            "   every step waits for a free CPU. A real cluster gives each rank its own link and cores.")


def lesson(rank, size, quick, gif_path):
    log(f"{size} ranks, backend {dist.get_backend()}; algorithms: {', '.join(ALL_REDUCE_ALGORITHMS)}")
    n = 1001 if quick else 1 << 20
    log("measuring every algorithm first (tables 2 and 3 below) ...")
    rows = check_algorithms(rank, size, n)
    costs = measure_costs(size, quick) if size > 1 else None
    # Then the one small traced call, and every table: DIST_SGD_VERBOSE=1 prints each message
    # as it goes, so what it prints for the ring sits right above the ring's table.
    show_ring(rank, size, gif_path)
    report(size, n, rows, costs)


def main():
    parser = lesson_parser(__doc__, world_size=4)
    parser.add_argument("--save-figures", action="store_true",
                        help="write the GIF to figures/ring_allreduce.gif (default: a temp directory)")
    args = parser.parse_args()
    if args.save_figures:
        gif = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "figures", "ring_allreduce.gif")
    else:
        gif = os.path.join(tempfile.mkdtemp(prefix="dist_sgd_"), "ring_allreduce.gif")
    launch(lesson, args.world_size, args.quick, gif, backend=args.backend)


if __name__ == "__main__":
    main()
