"""Lesson 10: scaling - why a laptop shows no speed-up, and what a network shows instead.

Everything so far made p processes compute exactly what one process computes. Does it make
training faster? The same measurements run twice: over this machine's loopback, then on an
emulated network (lesson 11's cluster: one network namespace per node, 100 Mbit/s links).

  1. Loopback: little or no speed-up. With two processes each has a core, so computing can
     at best halve; but every step also copies the whole gradient through the kernel on the
     same cores, and past the core count the processes take turns on the CPU. A "network"
     that is the CPU itself can never be the bottleneck, so no curve here means what it
     would on a cluster.
  2. The alpha-beta model: a message of n bytes costs alpha + n * beta. Fitted once to a
     ping-pong (never to the all-reduces it predicts), it predicts every all-reduce:
     ring 2(p-1) alpha + 2(p-1)/p n beta, tree 2 log2(p) (alpha + n beta) (costmodel.py).
     On one machine a second term joins it: what a message costs the CPU (measured alone,
     while two nodes swap messages), paid p/c times per step when p ranks share c cores.
  3. On the network, a curve means what it would on a cluster: the link, not the CPU, is
     what a big all-reduce waits for. The benchmark (figures/netscale.png) measures 2-16
     nodes: the ring's time barely grows with p, the tree's grows as log2 p, the naive one's
     as p; small messages are latency-bound, so there the tree beats the ring, up to a
     size the lesson prints for each node count, measured and predicted.
  4. Training on it (figures/nettrain.png): each node keeps its batch (weak scaling); a step
     is compute plus what the link costs; DDP hides part of it behind backward, PowerSGD and
     local SGD send less. The nodes still share this machine's cores, so compute itself
     slows down with p: the lesson keeps that apart from the link's cost.
  5. Validated on 2-16 nodes, the model extrapolates to 1024 workers on real networks,
     with the link alone: there every rank has cores of its own.

Without root (no network namespaces) part 3 shows the numbers in figures/ instead and says
how to measure them. Numbers measured here are your machine's; the committed ones are from
a quiet 2-core machine.

CPU only: what this lesson measures is gloo between CPU processes and over emulated links, so
its ranks use gloo and CPU tensors even where GPUs exist (--backend nccl is yours to try).

Run:
    python lessons/10_scaling.py                   # loopback; as root also 2 emulated nodes
    sudo python lessons/10_scaling.py --world-size 4 --quick
    torchrun --standalone --nproc-per-node 2 lessons/10_scaling.py --quick

Exercises:
  1. Compare "% of a step computes" on loopback and on the link. Which one is a cluster?
  2. Find the message size where ring and tree cost the same for p = 16 with the fitted alpha
     and beta (costmodel.predict_all_reduce). Is it where figures/netscale.png shows it?
  3. Why does the 16-node ring at 4 KiB take far longer than 30 alphas? How many turns on
     a core does each of its steps wait for (costmodel.turns)?
  4. With the extrapolation's numbers, which per-worker batch brings 1024 workers to 50%?
"""
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

from dist_sgd.comm.collectives import ALL_REDUCE_ALGORITHMS, all_reduce
from dist_sgd.comm.p2p import ping_pong
from dist_sgd.plumbing.check import check, max_diff
from dist_sgd.plumbing.figures import read_csv
from dist_sgd.scale.summaries import (MODEL_OF, NETACCURACY_TARGET, crossover_words,
                                      netaccuracy_summary, netscale_summary, nettrain_efficiency)
from dist_sgd.plumbing.launch import launch, lesson_parser
from dist_sgd.plumbing.rank import log, under_torchrun
from dist_sgd.plumbing.timing import summarize, time_alternating
from dist_sgd.scale import cluster, costmodel, netns
from dist_sgd.sgd.models import BigNet, count_parameters
from dist_sgd.sgd.sync import average_gradients

KiB, MiB = 2 ** 10, 2 ** 20


def run(rank, world_size, args):
    """Every rank: check our all-reduces, then time messages, all-reduces and a BigNet step."""
    x = torch.randn(1007, generator=torch.Generator().manual_seed(rank))  # odd: uneven chunks
    expected = x.clone()
    dist.all_reduce(expected)
    diffs = {}
    for algorithm in ALL_REDUCE_ALGORITHMS:
        got = x.clone()
        all_reduce(got, algorithm=algorithm)
        diffs[algorithm] = max_diff(got, expected)
    repeats = 3 if args.quick else 7
    pp = ping_pong(costmodel.shaped_link_sizes(args.quick), repeats)
    ways = {"gloo": dist.all_reduce, "ring": all_reduce,
            "tree": lambda t: all_reduce(t, algorithm="tree")}
    allreduce = {}
    for n in (16 * KiB, MiB):
        bufs = {a: torch.ones(n // 4) for a in ways}
        t = time_alternating({a: (lambda a=a: ways[a](bufs[a])) for a in ways}, repeats, 1)
        allreduce[n] = {a: summarize(s)["median"] for a, s in t.items()}
    # BigNet's forward and backward, 16 samples per rank, with and without average_gradients
    # (lesson 06); the SGD update is the same either way and left out.
    torch.manual_seed(0)
    model, batch = BigNet(), 16
    images, labels = torch.randn(batch, 1, 28, 28), torch.randint(0, 10, (batch,))

    def step(sync):
        model.zero_grad()
        F.nll_loss(model(images), labels).backward()
        if sync:
            average_gradients(model)
    steps = time_alternating({"compute only": lambda: step(False),
                              "with average_gradients": lambda: step(True)}, repeats, 1)
    return {"p": world_size, "diffs": diffs, "pp": pp, "allreduce": allreduce, "batch": batch,
            "bytes": 4 * count_parameters(model),
            "step": {k: summarize(v)["median"] for k, v in steps.items()}}


def show(r, where):
    """The same table wherever it was measured: checks, the fit, model vs measured, a step."""
    p = r["p"]
    for algorithm, diff in r["diffs"].items():
        log(check(f"all_reduce ({algorithm}) vs torch.distributed.all_reduce", diff, 1e-5))
    alpha, beta = costmodel.fit_link(r["pp"])  # loopback's big messages may show no slope
    log(f"\n--- {where}, {p} ranks: ping-pong fit alpha = {alpha * 1e6:.0f} us, 1/beta = "
        + (f"{8 / beta / 1e6:.0f} Mbit/s ---" if beta > 0 else "too fast to resolve ---"))
    for n, t in r["allreduce"].items():
        model = {a: costmodel.predict_all_reduce(MODEL_OF.get(a, a), n, p, alpha, beta)
                 for a in t}  # gloo's all-reduce is a ring
        log(f"  all-reduce {costmodel.human_bytes(n):>7s}: " + ", ".join(
            f"{a} {s * 1e3:6.2f} ms (model {model[a] * 1e3:6.2f})" for a, s in t.items()))
    alone, synced = r["step"]["compute only"], r["step"]["with average_gradients"]
    log(f"  BigNet, {r['batch']} samples per rank: {alone * 1e3:.1f} ms computing, "
        f"{synced * 1e3:.1f} ms with average_gradients of {r['bytes'] / 1e6:.1f} MB: "
        f"{alone / synced:.0%} of a step computes ({os.cpu_count()} cores"
        + (", fewer than ranks: they take turns)" if p > os.cpu_count() else ")"))


def on_the_network(args):
    """Run this file once in every node of an emulated cluster; node 0 prints its table."""
    flags = ["--world-size", str(args.world_size)] + (["--quick"] if args.quick else [])
    cmd = ["env", "RANK=$NODE_RANK", "WORLD_SIZE=$NNODES", "OMP_NUM_THREADS=1", "python3",
           "lessons/10_scaling.py", *flags]
    rate, burst = cluster.SCALING_RATE, cluster.SCALING_BURST
    log(f"\n$ sudo python3 -m dist_sgd.scale.cluster --nodes {args.world_size} --rate {rate} "
        f"--burst {burst} -- '{' '.join(cmd)}'")
    with cluster.Cluster(args.world_size, rate=rate, burst=burst) as c:
        c.run_ranks([__file__, *flags], timeout=600)


def recorded():
    """The curves the benchmark measured on 2-16 emulated nodes (figures/net*.csv)."""
    scale, train, acc = map(read_csv, ("netscale", "nettrain", "netaccuracy"))  # (rows, facts)
    log(f"\n--- figures/netscale.png: all-reduce on 2-16 nodes ---\n  measured on {scale[1]}")
    s = netscale_summary(scale[0])
    for a, (e, (_, p, n)) in s["error"]["model"].items():  # the model with this machine's CPU
        log(f"  {a:16s} model vs measured at >= 1 MiB: worst {e:.0%} ({p} nodes, "
            f"{costmodel.human_bytes(n)}); the link alone: {s['error']['model_link'][a][0]:.0%}")
    for (a, p), c in s["crossover"].items():
        log(f"  ring overtakes {a:16s} at {p:2d} nodes: {crossover_words(c)}")
    log("--- figures/nettrain.png: weak scaling of BigNet, efficiency vs one node alone ---")
    eff = nettrain_efficiency(train[0])
    ps = sorted({p for _, p in eff})
    log(f"  {'':24s}" + "".join(f"{f'{p} nodes':>10s}" for p in ps))
    log(f"  {'compute alone (CPU share)':24s}" + "".join(f"{eff['our DDP', p][1]:10.0%}"
                                                        for p in ps))
    for name in dict.fromkeys(name for name, _ in eff):
        log(f"  {name:24s}" + "".join(f"{eff[name, p][0]:10.0%}" for p in ps))
    log(f"--- figures/netaccuracy.png: to {NETACCURACY_TARGET:.0%} test accuracy on slow nodes "
        f"---\n  measured on {acc[1]}")
    for method, r in netaccuracy_summary(acc[0]).items():
        reach = (f"{r['seconds']:5.0f} s, {r['bytes'] / 1e6:6.1f} MB per node"
                 if r["seconds"] is not None else "not reached")
        log(f"  {method:18s} {reach}; final accuracy {r['final']:.1%}")


def extrapolate(compute, nbytes):
    log(f"\n--- the model at scale, link alone: BigNet's {compute * 1e3:.0f} ms, no overlap ---")
    for net, (gbit, lat) in (("10 Gbit/s Ethernet", (10, 25)), ("100 Gbit/s RDMA", (100, 5))):
        effs = [costmodel.predict_step(compute, nbytes, q, "ring", *costmodel.link(gbit, lat))[1]
                for q in (8, 64, 1024)]
        log(f"  {net:18s} ring: efficiency at 8 / 64 / 1024 workers " + " / ".join(
            f"{e:4.0%}" for e in effs))


def main():
    parser = lesson_parser(__doc__, world_size=2)
    args = parser.parse_args()
    if (int(os.environ["WORLD_SIZE"]) if under_torchrun() else args.world_size) < 2:
        parser.error("a ping-pong needs 2 ranks: --world-size 2 or more")
    # gloo unless asked otherwise: this lesson's tensors and models live on the CPU
    results = launch(run, args.world_size, args, backend=args.backend or "gloo")
    if results is None:
        return
    if "NNODES" in os.environ:  # dist_sgd.scale.cluster started this in one of its nodes
        return show(results[0], f"{os.environ['NNODES']} emulated nodes, "
                                f"{cluster.SCALING_RATE}/s links")
    show(results[0], "this machine's loopback")
    why = "under torchrun" if under_torchrun() else netns.privilege_problem()
    if why is None:
        on_the_network(args)
    else:
        log(f"\nNo emulated network here ({why}). To measure what figures/ shows (root, "
            "~30 min):\n  sudo python3 -m dist_sgd.bench netscale nettrain netaccuracy")
    recorded()
    extrapolate(results[0]["step"]["compute only"], results[0]["bytes"])


if __name__ == "__main__":
    main()
