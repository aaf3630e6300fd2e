"""Lesson 04: the ring all-reduce, written out, then four ways to all-reduce and what each costs.

all_reduce is the one collective data-parallel training cannot do without: after every
backward pass, every rank needs the sum of every rank's gradients. The ring computes it with
the fewest bytes any all-reduce can send. `ring_all_reduce` below is the whole algorithm:

    cut the tensor into p chunks (when p does not divide n, the first n % p are one longer)
    reduce-scatter, p-1 steps: every rank sends one chunk to its right neighbour and adds the
        chunk arriving from its left into its own copy; after p-1 steps rank r holds chunk r
        summed over all ranks
    all-gather, p-1 steps: the finished chunks travel once more around the ring

Every message is one chunk of ~n/p: each rank sends 2(p-1) messages, 2(p-1)/p n bytes in
all, nearly 2n whatever p is (the PyTorch tutorial's "ring" passes the whole tensor around
instead: p times more bytes). In every step a rank receives and sends, and it posts the
receive first: a send that waited for its peer to post a receive could wait on a peer that
is itself waiting to send.

The lesson prints the ring's steps on a tiny tensor (from the trace that the library's ring,
which sends the same messages, records; drawn as an animated GIF, with --save-figures into
figures/ring_allreduce.gif), checks the ring against the library's (dist_sgd.comm.allreduce)
and torch's, then runs the library's four textbook algorithms (and "ring_pipelined", the ring
tuned for big tensors), each against torch:

    naive             everyone sends its whole tensor to rank 0, which adds them up and sends
                      the sum back: rank 0 moves 2(p-1) whole tensors while the rest wait
    tree              a binomial tree: log2(p) rounds up to rank 0, the same tree back down
    ring              the one on this page
    halving_doubling  Rabenseifner: partners 1, 2, 4... apart swap halves, quarters...: the
                      ring's bytes in log2(p) steps instead of p-1

The alpha-beta model prices a message of n bytes at alpha + n beta (latency + bytes over
bandwidth), and adding n bytes at n gamma:
    naive   2(p-1)(alpha + n beta)              tree             2 log2(p) (alpha + n beta)
    ring    2(p-1) alpha + 2(p-1)/p n beta      halving_doubling 2 log2(p) alpha + 2(p-1)/p n beta
The tree wins for small messages (few latencies), the ring and halving-doubling for large
ones (few bytes). The lesson fits alpha and beta with a ping-pong (lesson 02), times an add
for gamma, and puts measured times beside the model's. A fit can come out 0 (noise larger
than what it measures): then it says so. The benchmark (`python -m dist_sgd.bench allreduce`)
measures the same at every size.

Honest caveat: on one machine the "network" is memory copies through the kernel's loopback
TCP, and with more ranks than cores the ranks also queue for a CPU, which the model ignores.

Run (from the repository root):
    python lessons/04_allreduce_algorithms.py --world-size 4
    torchrun --standalone --nproc-per-node 4 lessons/04_allreduce_algorithms.py
    python lessons/04_allreduce_algorithms.py --world-size 4 --save-figures   # the GIF

Exercises:
  0. Write the ring yourself: `python3 -m dist_sgd.course start ring_all_reduce` gives you this
     function with its body to write, `... check ring_all_reduce` grades it at world sizes 1-4
     (uneven lengths, bytes per rank counted), and `DIST_SGD_MINE=mine python3
     lessons/04_allreduce_algorithms.py` runs this lesson on yours.
  1. Count the bytes rank 0 sends with each algorithm at p = 2, 3, 4, 8 (the table gives
     the busiest rank's; DIST_SGD_VERBOSE=1 prints every message the library's algorithms
     send). Which grows with p?
  2. Where is the crossover between tree and ring in the model (solve for n)? Do the
     measured times agree? Try --world-size 3 and 4.
  3. Make ring_all_reduce pass the whole tensor around (the tutorial's version) and time
     it against the ring at 1 MiB. How far apart are they at p = 4?
  4. Why does every rank end with bitwise identical bytes with the ring, even though float
     addition is not associative? (Hint: who adds up each chunk?)
"""
import os
import statistics
import tempfile

import torch
import torch.distributed as dist

from dist_sgd.comm import ringviz
from dist_sgd.comm.collectives import ALL_REDUCE_ALGORITHMS, all_reduce
from dist_sgd.comm.p2p import ping_pong
from dist_sgd.plumbing.mine import swap_in
from dist_sgd.plumbing.check import check, max_diff
from dist_sgd.plumbing.figures import figure_path
from dist_sgd.plumbing.launch import launch, lesson_parser
from dist_sgd.plumbing.rank import device, log
from dist_sgd.plumbing.timing import time_alternating
from dist_sgd.scale import costmodel


def ring_all_reduce(x):
    """Sum x over every rank, in place, around a ring: a reduce-scatter, then an all-gather."""
    r, p = dist.get_rank(), dist.get_world_size()
    # ---- exercise ring_all_reduce: a reduce-scatter, then an all-gather, one chunk a message
    right, left = (r + 1) % p, (r - 1) % p
    chunks = x.tensor_split(p)  # views into x: the result lands in place
    inbox = torch.empty_like(chunks[0])  # chunk 0 is the largest
    # At step s the reduce-scatter sends chunk r-s-1 (the one it added into at the step
    # before; at step 0 its own), the all-gather chunk r-s (the finished one it got last).
    # Either way the left neighbour sends the chunk just before ours: the one we add or take.
    for phase, lag in (("reduce-scatter", 1), ("all-gather", 0)):
        for step in range(p - 1):
            give = (r - step - lag) % p
            take = (give - 1) % p
            incoming = inbox[:chunks[take].numel()]
            ops = [dist.P2POp(dist.irecv, incoming, left),  # the receive is posted first
                   dist.P2POp(dist.isend, chunks[give], right)]
            for request in dist.batch_isend_irecv(ops):  # NCCL needs the pair launched together
                request.wait()
            if phase == "reduce-scatter":
                chunks[take].add_(incoming)  # one more rank's share of this chunk
            else:
                chunks[take].copy_(incoming)  # a finished chunk: take it as it is
    # ---- end of exercise


# DIST_SGD_MINE: a learner's version replaces this one
swap_in(globals(), "ring_all_reduce", ("ring_all_reduce",), lesson="04")


def everyone(obj):
    """Every rank's obj, in rank order (torch's all_gather_object: any picklable thing)."""
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def show_ring(rank, size, gif_path):
    n = 2 * size + 1  # p does not divide n: chunks of uneven size
    trace = []  # the library's ring sends the same messages as the one above, and records them
    all_reduce(torch.ones(n, device=device()), algorithm="ring", trace=trace)
    traces = everyone(trace)
    messages = [m for t in traces for m in t]
    sizes = [len(c) for c in torch.empty(n).tensor_split(size)]
    log(f"\n1. the ring on {n} numbers, chunks of {sizes}: chunk cK; 'a+b' = the sum of ranks a "
        "and b's data")
    for line in ringviz.table(messages, size):
        log("   " + line)
    log(check(f"ring: messages per rank vs 2(p-1) = {2 * (size - 1)}",
              max(abs(len(t) - 2 * (size - 1)) for t in traces), 0))
    log(check(f"ring: largest message beyond ceil(n/p) = {-(-n // size)} numbers",
              max([m["numel"] - -(-n // size) for m in messages], default=0), 0))
    if size > 1 and rank == 0:
        ringviz.draw_gif(messages, size, gif_path)
        log(f"   drawn as an animation: {gif_path}")


def check_algorithms(rank, size, n):
    """The page's ring and every library algorithm, against torch on the same random input."""
    x = torch.randn(n, generator=torch.Generator().manual_seed(rank)).to(device())
    expected, mine, library = x.clone(), x.clone(), x.clone()
    dist.all_reduce(expected)
    ring_all_reduce(mine)
    all_reduce(library, algorithm="ring")
    log(f"\n2. on {n:,} random float32 numbers per rank ({n % size} chunks one longer)")
    log(check("ring_all_reduce vs the library's ring, all ranks",
              max(everyone(max_diff(mine, library))), 0))  # the same sums in the same order
    log(check("ring_all_reduce vs torch, all ranks", max(everyone(max_diff(mine, expected))), 1e-5))
    log(f"   {'algorithm':16s} {'ranks with the same bytes':>26s}  {'messages':>8s}  "
        f"{'kB sent by the busiest rank':>27s}")
    for alg in ALL_REDUCE_ALGORITHMS:
        got, trace = x.clone(), []
        all_reduce(got, algorithm=alg, trace=trace)
        ranks = everyone((max_diff(got, expected), got.cpu(), trace))
        same = all(torch.equal(t, ranks[0][1]) for _, t, _ in ranks)
        log(f"   {alg:16s} {size if same else 'NO':>26}  {max(len(t) for *_, t in ranks):8d}  "
            f"{max(sum(m['nbytes'] for m in t) for *_, t in ranks) / 1e3:27.1f}")
        log("   " + check(f"all_reduce ({alg}) vs torch, all ranks", max(d for d, *_ in ranks),
                      1e-5))


def per_byte(name, seconds, meaning):
    """A fitted cost per byte as a rate; 0 (the fit keeps it >= 0) means noise hid it."""
    if seconds <= 0:
        return f"{name} ~ 0: {meaning} is lost in the noise at these sizes"
    return f"1/{name} = {1 / seconds / 1e9:.2f} GB/s"


def ms(seconds):
    return f"{seconds * 1e3:8.2f}ms"


def costs(size, quick):
    """Fit alpha and beta with a ping-pong, gamma by timing an add; time every algorithm."""
    rows = ping_pong([8, 1 << 12, 1 << 16, 1 << 20], repeats=3 if quick else 10)
    alpha, beta = costmodel.fit_alpha_beta([r["bytes"] for r in rows], [r["seconds"] for r in rows])
    a, b = torch.rand(1 << 20, device=device()), torch.rand(1 << 20, device=device())
    added = time_alternating({"add": lambda: a.add_(b)}, repeats=5, warmup=1)["add"]
    gamma = statistics.median(added) / a.nbytes
    log(f"\n3. the alpha-beta model against measured times (median, slowest rank)\n"
        f"   alpha = {alpha * 1e6:.1f} us per message; {per_byte('beta', beta, 'sending')}; "
        f"{per_byte('gamma', gamma, 'the addition')}")
    log(f"   {'size':>8s}  {'algorithm':16s} {'predicted':>10s} {'measured':>10s}")
    for nbytes in (1 << 16, 1 << 20) if quick else (1 << 14, 1 << 18, 1 << 22):
        bufs = {alg: torch.rand(nbytes // 4, device=device()) for alg in ALL_REDUCE_ALGORITHMS}
        runs = {alg: (lambda t=bufs[alg], alg=alg: all_reduce(t, algorithm=alg)) for alg in bufs}
        runs["ring_all_reduce"] = lambda t=bufs["ring"].clone(): ring_all_reduce(t)
        runs["torch"] = lambda t=bufs["ring"].clone(): dist.all_reduce(t)
        # Interleaved (A B C ... A B C ...) with medians: load bursts hit every candidate alike.
        samples = time_alternating(runs, repeats=3 if quick else 10, warmup=1)
        for alg, seconds in samples.items():
            model = "ring" if alg == "ring_all_reduce" else alg
            predicted = "" if alg == "torch" else ms(costmodel.predict_all_reduce(
                model, nbytes, size, alpha, beta, gamma))  # gloo's algorithm is its own
            log(f"   {nbytes / 2**20:6.3g}MB  {alg:16s} {predicted:>10s} "
                + ms(statistics.median(seconds)))
    log("   Here the 'network' is memory copies over loopback: every byte sent is copied by a CPU.")
    if size > (os.cpu_count() or 1):
        log(f"   {size} ranks share {os.cpu_count()} cores: every step also waits for a free CPU.")


def run(rank, world_size, args):
    log(f"{world_size} ranks, backend {dist.get_backend()}")
    show_ring(rank, world_size, args.gif)
    check_algorithms(rank, world_size, 1001 if args.quick else 1 << 20)
    if world_size > 1:
        costs(world_size, args.quick)


def main():
    parser = lesson_parser(__doc__, world_size=4, save_figures=True)
    args = parser.parse_args()
    args.gif = figure_path("ring_allreduce.gif") if args.save_figures else \
        os.path.join(tempfile.mkdtemp(prefix="dist_sgd_"), "ring_allreduce.gif")
    launch(run, args.world_size, args, backend=args.backend)


if __name__ == "__main__":
    main()
