"""Lesson 10: scaling - measured on this machine, and predicted for real clusters.

Everything so far made p processes compute exactly what one process computes. Does it make
training faster? This lesson measures a little of that on your machine, then walks through
the numbers behind the figures the benchmark draws into figures/ (README, "Figures"):

    fig 1 allreduce.png   all-reduce bus bandwidth: our algorithms vs gloo
    fig 2 p2p.png         send/recv latency (alpha) and bandwidth (1/beta) by message size
    fig 3 scaling.png     samples/s and efficiency vs world size, strong and weak scaling
    fig 4 breakdown.png   where a step's time goes: compute, waiting, communication
    fig 6 atscale.png     the alpha-beta cost model from 1 to 1024 workers, vs published runs

What it shows, in five points:
  1. Little or no speed-up on a 2-core laptop. With two processes each has a core, so
     computing can at best halve; but every step now also sends the whole gradient through
     the kernel's loopback (on the same two cores) and waits for the slower rank. Past the
     core count (3 or 4 processes on 2 cores) the processes take turns on the CPU: computing
     cannot get faster at all, and communication gets slower (oversubscription).
  2. A model of communication: a message of n bytes costs alpha + n * beta. All-reduce
     algorithms differ in how many messages (alpha terms) and how many bytes (beta terms)
     they need: dist_sgd/costmodel.py has the table.
  3. Ring vs tree: ring moves the fewest bytes (2(p-1)/p n) but takes 2(p-1) steps; a tree
     takes 2 log2 p steps but moves the whole tensor in each. Small messages are latency-
     bound, so the tree wins; big ones are bandwidth-bound, so the ring wins; the crossover
     moves to bigger messages as p grows.
  4. Why buckets: one all-reduce per parameter pays alpha per tensor; one all-reduce of
     everything at the end cannot overlap with backward. Buckets of ~25 MB pay few alphas and
     start sending while backward is still computing the earlier layers' gradients.
  5. The linear scaling rule (Goyal et al. 2017): with p workers, keep each worker's batch b,
     multiply the learning rate by p; then training takes 1/p as many steps. Wall-clock
     speed-up = p * efficiency. A bigger per-worker batch raises efficiency (more compute per
     gradient byte), but the rule itself breaks down past some global batch (~8k images for
     ImageNet), so you cannot hide communication behind ever bigger batches.

The committed figures were measured on a quiet 2-core machine; the numbers measured here are
from yours, so they differ (the benchmark re-measures everything on yours in ~4 minutes).

Run:
    python lessons/10_scaling.py --world-size 2
    python lessons/10_scaling.py --quick                  # fewer repeats
    torchrun --standalone --nproc-per-node 2 lessons/10_scaling.py --quick

Exercises:
  1. Run with --world-size 4 on a 2-core machine. Which number in the step table gets worse:
     compute or communication? Why both?
  2. Find the message size where ring and tree cost the same for p = 16, alpha = 25 us and
     10 Gbit/s (costmodel.predict_all_reduce and costmodel.link). Check it with the table below.
  3. In the last table, which per-worker batch brings BigNet on 64 workers on 10 GbE to 90%
     efficiency? Why does a bigger batch help? (Compute grows about linearly with the batch.)
  4. Why does a single parameter server stop scaling at a few dozen workers, and how do
     sharded parameter servers (one shard of the parameters per server) change its formula?
"""
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

from dist_sgd.scale import costmodel
from dist_sgd.plumbing.check import check, max_diff
from dist_sgd.comm.collectives import ALL_REDUCE_ALGORITHMS, all_reduce
from dist_sgd.scale.costmodel import human_bytes
from dist_sgd.plumbing.figures import read_csv
from dist_sgd.plumbing.launch import launch, lesson_parser
from dist_sgd.plumbing.rank import log
from dist_sgd.sgd.models import BigNet, count_parameters
from dist_sgd.comm.p2p import ping_pong
from dist_sgd.sgd.sync import average_gradients
from dist_sgd.plumbing.timing import summarize, time_alternating

KiB, MiB = 2 ** 10, 2 ** 20


def measure(rank, world_size, quick):
    """Every rank: check our all-reduces, then time messages, all-reduces and a BigNet step."""
    x = torch.randn(1007, generator=torch.Generator().manual_seed(rank))  # odd: uneven chunks
    expected = x.clone()
    dist.all_reduce(expected)
    diffs = {}
    for algorithm in ALL_REDUCE_ALGORITHMS:
        got = x.clone()
        all_reduce(got, algorithm=algorithm)
        diffs[algorithm] = max_diff(got, expected)

    repeats = 3 if quick else 7
    pp = ping_pong([8, 64 * KiB, 1 * MiB, 4 * MiB], repeats)
    allreduce = {}
    for n in (16 * KiB, 4 * MiB):
        bufs = {a: torch.ones(n // 4) for a in ("tree", "ring", "gloo")}
        ways = {a: (lambda t=bufs[a], a=a: all_reduce(t, algorithm=a)) for a in ("tree", "ring")}
        ways["gloo"] = lambda t=bufs["gloo"]: dist.all_reduce(t)
        allreduce[n] = {a: summarize(s)["median"] for a, s in time_alternating(ways, repeats, 1).items()}

    # A BigNet step on 16 samples per rank, with and without average_gradients (lesson 06).
    torch.manual_seed(0)
    model, batch = BigNet(), 16
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    images, labels = torch.randn(batch, 1, 28, 28), torch.randint(0, 10, (batch,))

    def step(sync):
        opt.zero_grad()
        F.nll_loss(model(images), labels).backward()
        if sync:
            average_gradients(model)
        opt.step()
    steps = time_alternating({"compute only": lambda: step(False),
                              "with average_gradients": lambda: step(True)}, repeats, 1)
    return {"world_size": world_size, "diffs": diffs, "ping_pong": pp, "allreduce": allreduce,
            "batch": batch, "grad_bytes": 4 * count_parameters(model),
            "step": {k: summarize(v)["median"] for k, v in steps.items()}}


def walk_through(r):
    p = r["world_size"]
    for algorithm, diff in r["diffs"].items():
        log(check(f"all_reduce ({algorithm}) vs torch.distributed.all_reduce", diff, 1e-5))

    alpha, beta = costmodel.fit_alpha_beta([m["bytes"] for m in r["ping_pong"]],
                                           [m["seconds"] for m in r["ping_pong"]])
    log("\n--- figure 2: point to point, ranks 0 and 1 play ping-pong ---")
    for m in r["ping_pong"]:
        log(f"  {human_bytes(m['bytes']):>7s}: {m['seconds'] * 1e6:9.1f} us one way, "
            f"{m['bandwidth'] / 1e9:6.3f} GB/s")
    log(f"  fit t = alpha + n * beta: alpha = {alpha * 1e6:.0f} us per message, 1/beta = "
        f"{1 / beta / 1e9:.2f} GB/s: below ~{human_bytes(alpha / beta)} a message is mostly latency")

    log(f"\n--- figure 1: all-reduce at world size {p}, measured, and the model with that fit ---")
    for n, t in r["allreduce"].items():
        log(f"  {human_bytes(n):>7s}: " + ", ".join(
            f"{a} {s * 1e3:.2f} ms" + ("" if a == "gloo" else
                                       f" (model {costmodel.predict_all_reduce(a, n, p, alpha, beta) * 1e3:.2f})")
            for a, s in t.items()))
    log("  (the model counts messages and bytes only: Python's per-message cost and two ranks\n"
        "   sharing two cores with the copying are not in it; gloo's all-reduce is C++)")
    a10, b10 = costmodel.link(10, 25)
    log("  the model for 16 workers on 10 Gbit/s Ethernet (alpha 25 us):")
    for n in (16 * KiB, 1 * MiB, 64 * MiB):
        ring, tree = (costmodel.predict_all_reduce(a, n, 16, a10, b10) for a in ("ring", "tree"))
        log(f"    {human_bytes(n):>7s}: ring {ring * 1e3:7.2f} ms, tree {tree * 1e3:7.2f} ms: "
            f"{'ring' if ring < tree else 'tree'} is faster")

    s, b = r["step"], r["batch"]
    log(f"\n--- figures 3 and 4: a BigNet step here, {b} samples per rank, "
        f"{r['grad_bytes'] / 1e6:.1f} MB of gradients, {p} ranks ---")
    for name, t in s.items():
        log(f"  {name:24s} {t * 1e3:7.1f} ms per step, {b * p / t:6.0f} samples/s over {p} ranks")
    log(f"  {s['compute only'] / s['with average_gradients']:.0%} of a step computes; this machine "
        f"has {os.cpu_count()} cores" + (", fewer than ranks: they take turns" if p > os.cpu_count() else ""))
    try:
        rows, facts = read_csv("scaling")
    except FileNotFoundError:
        rows, facts = [], "figures/scaling.csv is not there (README, Figures: the benchmark)"
    log(f"  figures/scaling.csv (weak scaling: efficiency vs one plain process), measured on {facts}:")
    for model in dict.fromkeys(r["model"] for r in rows):
        sizes = sorted({r["world_size"] for r in rows if r["model"] == model})
        log(f"    {model:6s} {'':18s}" + "".join(f"{'p=' + str(q):>7s}" for q in sizes))
        for name in ("average_gradients", "our DDP", "torch DDP"):
            eff = {r["world_size"]: r["efficiency"] for r in rows if r["model"] == model
                   and r["mode"] == "weak" and r["strategy"] == name}
            log(f"    {'':6s} {name:18s}" + "".join(f"{eff[q]:7.0%}" for q in sizes))

    log("\n--- figure 6: the cost model at scale, fed with BigNet's compute measured above ---")
    compute = s["compute only"]
    for net, (gbit, lat) in (("10 Gbit/s Ethernet", (10, 25)), ("100 Gbit/s RDMA", (100, 5))):
        link = costmodel.link(gbit, lat)
        for algorithm in ("ring", "tree", "parameter_server"):
            effs = [costmodel.predict_step(compute, r["grad_bytes"], q, algorithm, *link)[1]
                    for q in (8, 64, 1024)]
            log(f"  {net:18s} {algorithm:16s} efficiency at 8 / 64 / 1024 workers: "
                + " / ".join(f"{e:4.0%}" for e in effs) + " (no overlap)")
    _, goyal = costmodel.predict_step(0.3, 102.4e6, 256, "ring", *costmodel.link(50, 25))
    log(f"  Goyal et al. 2017 (ResNet-50, 256 GPUs, 50 Gbit/s, ~0.3 s compute assumed): "
        f"published ~90%, model {goyal:.0%} with no overlap, 100% with perfect overlap")

    log("\n--- the linear scaling rule: speed-up = workers x efficiency ---")
    for per_worker in (16, 64, 256):
        _, eff = costmodel.predict_step(compute * per_worker / b, r["grad_bytes"], 64, "ring",
                                        *costmodel.link(10, 25))
        log(f"  BigNet, 64 workers on 10 GbE, {per_worker:3d} samples per worker (global "
            f"{64 * per_worker:5d}): efficiency {eff:4.0%}, {64 * eff:4.1f}x one worker's speed")


def main():
    args = lesson_parser(__doc__, world_size=2).parse_args()
    # gloo unless asked otherwise: this lesson's tensors and models live on the CPU
    results = launch(measure, args.world_size, args.quick, backend=args.backend or "gloo")
    if results is not None:
        walk_through(results[0])


if __name__ == "__main__":
    main()
