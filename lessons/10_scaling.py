"""Lesson 10: scaling - measured on this machine, and predicted for real clusters.

Everything so far made p processes compute exactly what one process computes. Does it make
training faster? This lesson measures a little of that on your machine and reads the
figures that `python -m dist_sgd.bench` draws into figures/:

    fig 1 allreduce.png   all-reduce bus bandwidth: our naive/tree/ring/halving-doubling vs gloo
    fig 2 p2p.png         send/recv latency (alpha) and bandwidth (1/beta) by message size
    fig 3 scaling.png     samples/s and efficiency vs world size, strong and weak scaling
    fig 4 breakdown.png   where a step's time goes: compute, waiting, communication
    fig 5 (lesson 07)     step time vs DDP bucket size
    fig 6 atscale.png     the alpha-beta cost model from 1 to 1024 workers, vs published runs

What it shows, in five points (the numbers printed below are from your machine):
  1. Little or no speed-up on a 2-core laptop. With two processes each has a core, so
     computing can at best halve; but every step now also sends the whole gradient through
     the kernel's loopback (on the same two cores) and waits for the slower rank. For the
     lessons' small Net, a step computes for a few milliseconds and communicating costs about
     as much: two processes are no faster than one. The bigger BigNet gains something at two.
     Past the core count (3 or 4 processes on 2 cores) the processes take turns on the CPU:
     computing cannot get faster at all, and communication gets slower (oversubscription).
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

Run:
    python lessons/10_scaling.py --world-size 2          # also runs the quick benchmarks (~2 min)
    python lessons/10_scaling.py --world-size 2 --quick  # only the small measurement below
    torchrun --standalone --nproc-per-node 2 lessons/10_scaling.py --quick
    python -m dist_sgd.bench                              # re-measure and redraw every figure (~4 min)

Exercises:
  1. Run with --world-size 4 on a 2-core machine. Which number in the step table gets worse:
     compute or communication? Why both?
  2. In costmodel.py, find the message size where ring and tree cost the same for p = 16,
     alpha = 25 us and 10 Gbit/s. Check it with predict_all_reduce.
  3. The cost model says our BigNet scales to ~80% efficiency on 64 workers on 10 GbE. What
     per-worker batch would you need for 90%? (Compute grows about linearly with the batch.)
  4. Why does a single parameter server stop scaling at a few dozen workers, and how do
     sharded parameter servers (one shard of the parameters per server) change its formula?
"""
import os
import subprocess
import sys
import tempfile

import torch
import torch.distributed as dist

from dist_sgd import costmodel, models  # noqa: E402
from dist_sgd.bench.scaling import build, make_steps  # noqa: E402
from dist_sgd.costmodel import human_bytes  # noqa: E402
from dist_sgd.launch import launch, lesson_parser, log, under_torchrun  # noqa: E402
from dist_sgd.timing import summarize, time_alternating  # noqa: E402

KiB, MiB = 2 ** 10, 2 ** 20


def measure(rank, world_size, quick):
    """A small version of figures 1-4, measured on every rank; rank 0's view is returned."""
    from dist_sgd.bench.allreduce import check_against_torch
    from dist_sgd.collectives import all_reduce
    from dist_sgd.p2p import ping_pong

    # Check first: our all-reduce algorithms must equal torch's before we time them.
    max_diff = check_against_torch()

    repeats = 3 if quick else 7
    pp = ping_pong([8, 64 * KiB, 1 * MiB, 4 * MiB] if not quick else [8, 1 * MiB, 4 * MiB], repeats)
    times = {}
    for n in (16 * KiB, 4 * MiB):
        bufs = {a: torch.ones(n // 4) for a in ("tree", "ring", "gloo")}
        cands = {a: (lambda t=bufs[a], a=a: all_reduce(t, algorithm=a)) for a in ("tree", "ring")}
        cands["gloo"] = lambda t=bufs["gloo"]: dist.all_reduce(t)
        times[n] = {a: summarize(s)["median"] for a, s in time_alternating(cands, repeats, 1).items()}

    batch = 8 if quick else 32
    # "single process": the same step with no communication, run on every rank at once
    steps = make_steps(build("bignet"), batch, ("single process", "average_gradients", "torch DDP"))
    step = {a: summarize(s)["median"] for a, s in time_alternating(steps, repeats, 1).items()}
    return {"max_diff": max_diff, "ping_pong": pp, "allreduce": times, "step": step,
            "batch": batch, "grad_bytes": 4 * models.count_parameters(build("bignet"))}


def committed_scaling():
    """Lines quoting the committed figure 3 numbers, if figures/scaling.csv is there."""
    from dist_sgd.bench import common

    try:
        rows, facts = common.read_csv("scaling")
    except (FileNotFoundError, OSError):
        return []
    lines = []
    for model in dict.fromkeys(r["model"] for r in rows):
        for p in sorted({r["world_size"] for r in rows if r["world_size"] > 1}):
            effs = [f"{r['strategy']} {r['efficiency']:.0%}" for r in rows
                    if r["model"] == model and r["mode"] == "weak" and r["world_size"] == p]
            lines.append(f"{model}, {p} processes: " + ", ".join(effs))
    return lines + [f"(measured on: {facts})"]


def walk_through(r, world_size):
    cores = os.cpu_count() or 1
    log(f"\nour four all-reduce algorithms equal torch.distributed.all_reduce: "
        f"max diff {r['max_diff']:.1e}")

    alpha, beta = costmodel.fit_alpha_beta([m["bytes"] for m in r["ping_pong"]],
                                           [m["seconds"] for m in r["ping_pong"]])
    log("\n--- figure 2: point to point (ranks 0 and 1 play ping-pong) ---")
    for m in r["ping_pong"]:
        log(f"  {human_bytes(m['bytes']):>9s}: {m['seconds'] * 1e6:9.1f} us one way, "
            f"{m['bandwidth'] / 1e9:6.3f} GB/s")
    log(f"  fit: alpha = {alpha * 1e6:.0f} us per message, 1/beta = {1 / beta / 1e9:.2f} GB/s"
        f" -> below ~{human_bytes(alpha / beta)} a message is mostly latency")

    log(f"\n--- figure 1: all-reduce at world size {world_size}, measured vs the model ---")
    for n, t in r["allreduce"].items():
        cells = ", ".join(f"{a} {s * 1e3:.2f} ms (model {costmodel.predict_all_reduce(a, n, world_size, alpha, beta) * 1e3:.2f})"
                          if a != "gloo" else f"gloo {s * 1e3:.2f} ms" for a, s in t.items())
        log(f"  {human_bytes(n):>7s}: {cells}")
    log("  (with 2 ranks ring and tree send the same number of messages (2 each), yet our ring is\n"
        "   often slower at small sizes here: both ranks send at once and its sends are posted\n"
        "   while the peer is busy, so a message waits for a descheduled thread on 2 cores;\n"
        "   the tree's messages go one way at a time. The model has no term for that. The\n"
        "   ring's advantage is bandwidth at larger p - see figures/allreduce.png and below)")
    p, a10, b10 = 16, *costmodel.link(10, 25)
    for n in (16 * KiB, 64 * MiB):
        ring = costmodel.predict_all_reduce("ring", n, p, a10, b10)
        tree = costmodel.predict_all_reduce("tree", n, p, a10, b10)
        log(f"  model, 16 workers on 10 GbE, {human_bytes(n):>7s}: ring {ring * 1e3:7.2f} ms, "
            f"tree {tree * 1e3:7.2f} ms -> {'ring' if ring < tree else 'tree'} wins")

    s = r["step"]
    compute = s["single process"]
    log(f"\n--- figures 3 and 4: a BigNet step, {r['batch']} samples per rank, "
        f"{r['grad_bytes'] / 1e6:.1f} MB of gradients ---")
    for name, t in s.items():
        label = "no communication" if name == "single process" else name
        log(f"  {label:18s} {t * 1e3:7.1f} ms per step  "
            f"({r['batch'] * world_size / t:7.0f} samples/s over {world_size} ranks)")
    for name in ("average_gradients", "torch DDP"):
        share = compute / s[name]
        log(f"  {name}: {share:.0%} of a step computes, {1 - share:.0%} communicates or waits")
    log("  (\"no communication\" is every rank computing its own batch and never syncing: the\n"
        "   best the ranks could do together on these cores; the speed-up over a lone process\n"
        "   is in figures/scaling.png)")
    log(f"  this machine has {cores} cores; {world_size} processes"
        + (" share them: oversubscribed, each computes slower than a lone process would, "
           "so there is no speed-up." if world_size > cores
           else " each get one, yet each step also sends the gradients through the kernel "
                "(on the same cores) and waits for the slower rank."))
    committed = committed_scaling()
    if committed:
        log("\n  from figures/scaling.csv (the committed full run; weak scaling, efficiency "
            "vs one plain process):")
        for line in committed:
            log("    " + line)

    log("\n--- figure 6: the cost model at scale (BigNet's compute measured above) ---")
    for net, (gbit, lat) in (("10 GbE", (10, 25)), ("100 Gbit/s RDMA", (100, 5))):
        al, be = costmodel.link(gbit, lat)
        effs = [costmodel.predict_step(compute, r["grad_bytes"], p, "ring", al, be)[1]
                for p in (8, 64, 1024)]
        log(f"  ring, {net:15s}: efficiency at 8 / 64 / 1024 workers: "
            + " / ".join(f"{e:.0%}" for e in effs) + " (no overlap)")
    al, be = costmodel.link(50, 25)
    _, goyal = costmodel.predict_step(0.3, 102.4e6, 256, "ring", al, be)
    log(f"  Goyal et al. 2017 (ResNet-50, 256 GPUs, 50 Gbit/s, ~0.3 s compute assumed): "
        f"published ~90%, model {goyal:.0%} with no overlap, 100% with perfect overlap")
    log("\n--- linear scaling rule: speed-up = p x efficiency ---")
    for b in (32, 128):
        _, eff = costmodel.predict_step(compute * b / r["batch"], r["grad_bytes"], 64, "ring",
                                        *costmodel.link(10, 25))
        log(f"  BigNet, 64 workers on 10 GbE, {b:3d} samples per worker (global {64 * b}): "
            f"efficiency {eff:.0%} -> {64 * eff:.0f}x faster per epoch")


def main():
    args = lesson_parser(__doc__, world_size=2).parse_args()
    log(__doc__.split("\n\n")[0])
    # gloo unless asked otherwise: this lesson's tensors and models live on the CPU
    results = launch(measure, args.world_size, args.quick, backend=args.backend or "gloo")
    # The group is gone now (launch tears it down): under torchrun, print from RANK 0 only.
    world_size = int(os.environ["WORLD_SIZE"]) if under_torchrun() else args.world_size
    if not under_torchrun() or int(os.environ["RANK"]) == 0:
        walk_through(results[0], world_size)
    if not args.quick and not under_torchrun():
        folder = tempfile.mkdtemp(prefix="lesson10_figures_")
        print(f"\n--- the quick benchmarks (figures 1-6 at small size) into {folder}; the "
              f"committed figures/ stay as they are ---", flush=True)
        env = dict(os.environ, DIST_SGD_FIGURES=folder)
        subprocess.run([sys.executable, "-m", "dist_sgd.bench", "--quick"], env=env, check=True,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        print(f"\nopen the PNGs in {folder} next to those in figures/", flush=True)


if __name__ == "__main__":
    main()
