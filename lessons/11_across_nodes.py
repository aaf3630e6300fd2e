"""Lesson 11: across nodes - a real link, where communication costs more than computing.

On one machine (lessons 01-10) the "network" is the CPU copying bytes through loopback: every
byte sent costs the cores that compute, so nothing can overlap and nothing is link-bound. Here
the lesson builds a small cluster on this one machine (dist_sgd.scale.cluster): each node is a Linux
network namespace with its own network stack, plugged into a bridge (a switch) by a link that
`tc ... tbf` limits to 1 Gbit/s in each direction, like a cheap Ethernet port. Then it runs
itself once in every node, exactly as a cluster runs a job, and measures:

  1. ping-pong on the link: fit t = alpha + n * beta and compare 1/beta with the link's rate;
  2. a ring step's exchange in two orders: isend posted before recv (gloo writes the whole
     send from the caller's thread before the receive is posted, so the two directions take
     turns), and irecv posted before isend (both directions at once), next to gloo's own
     all-reduce and our library's ring; every result checked against the single-machine sum;
  3. lesson 07's DDP strategies on BigNet (4.8 MB of gradients, ~40 ms on this link): an
     all-reduce after backward adds its whole time to the step; buckets all-reduced during
     backward can hide up to the length of backward - when the link, not the CPU, is what
     the step waits for;
  4. the cost model's predicted step time (fitted alpha and beta) against the measured one:
     compute + all-reduce after backward; forward + max(backward, all-reduce) with overlap.

Needs root (network namespaces); without it the lesson says so, shows the numbers recorded in
figures/cluster.csv (the figures' benchmark measures them, see the README) and runs the same
measurements over loopback for comparison. Honest expectations: the nodes share this machine's
cores. Ping-pong and all-reduce are bound by the 1 Gbit/s link even on a busy machine; a
training step is not: on 2 cores with other work running, computing BigNet's step takes far
longer than its all-reduce, and gloo's sending thread competes with backward for a core, so
overlap gains little (compare the "no communication" row with the rest, and `uptime`'s load).

Run:
    sudo python lessons/11_across_nodes.py             # 2 nodes at 1 Gbit/s
    sudo python lessons/11_across_nodes.py --quick     # small sizes, ~20 s
On a real cluster (or through `python -m dist_sgd.scale.cluster --nodes 2 -- '...'`) every lesson runs
with the commands a cluster uses, for instance on each of 2 machines:
    torchrun --nnodes 2 --node-rank $NODE_RANK --nproc-per-node 1 \\
             --master-addr $MASTER_ADDR --master-port $MASTER_PORT lessons/07_ddp_from_scratch.py

Exercises:
  1. Run with --rate 100mbit: which numbers scale by 10, which do not (alpha)?
  2. Why does an 8 MiB exchange with isend first take twice as long, although the link is full
     duplex? Reread lesson 02 on when a blocking recv is posted.
  3. Make the batch 4x smaller: what does the cost model predict for the overlap, and why?
"""
import argparse
import csv
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

from dist_sgd.scale import cluster
from dist_sgd.comm import collectives
from dist_sgd.scale import costmodel
from dist_sgd.ddp import ddp
from dist_sgd.ddp import steps as ddp_steps
from dist_sgd.comm import p2p
from dist_sgd.plumbing.check import check, max_diff
from dist_sgd.plumbing.launch import launch, lesson_parser
from dist_sgd.plumbing.rank import log
from dist_sgd.sgd.models import BigNet
from dist_sgd.plumbing.timing import summarize, time_alternating

MiB = 2 ** 20


def ring_all_reduce(t, recv_first):
    # The textbook ring: p-1 reduce-scatter steps, then p-1 all-gather steps, n/p bytes each.
    r, p = dist.get_rank(), dist.get_world_size()
    chunks = t.tensor_split(p)  # views: the result lands in t
    for step in range(2 * (p - 1)):
        mine, theirs = chunks[(r - step) % p], chunks[(r - step - 1) % p]
        incoming = torch.empty_like(theirs)
        # One exchange: send `mine` to the right, receive `theirs` from the left. The order:
        if recv_first:  # the receive is waiting before a byte leaves: both directions at once
            request = dist.irecv(incoming, (r - 1) % p)
            dist.isend(mine, (r + 1) % p).wait()
        else:  # isend writes the whole chunk before recv is posted: the directions take turns
            request = dist.isend(mine, (r + 1) % p)
            dist.recv(incoming, (r - 1) % p)
        request.wait()
        if step < p - 1:
            theirs.add_(incoming)  # reduce-scatter: add the neighbour's partial sum
        else:
            theirs.copy_(incoming)  # all-gather: take the finished chunk
    return t


def on_the_link(rank, world_size, quick):
    repeats, sizes = 3 if quick else 7, [2 ** k for k in range(10, 23 if quick else 25, 2 if quick else 1)]
    out = {"ping-pong": p2p.ping_pong(sizes, repeats=repeats)}  # 1 KiB .. 4 (16) MiB
    algorithms = {"isend before recv": lambda t: ring_all_reduce(t, recv_first=False),
                  "irecv before isend": lambda t: ring_all_reduce(t, recv_first=True),
                  "our ring": collectives.all_reduce, "gloo": dist.all_reduce}
    # Every rank's input is known everywhere, so the single-machine sum is too.
    inputs = [torch.randn(MiB, generator=torch.Generator().manual_seed(r)) for r in range(world_size)]
    results = {name: inputs[rank].clone() for name in algorithms}
    for name, fn in algorithms.items():
        fn(results[name])  # every one of them reduces in place
    out["diffs"] = {n: max_diff(t, torch.stack(inputs).sum(0)) for n, t in results.items()}
    buffers = {m: torch.ones(m * MiB // 4) for m in ([1, 4] if quick else [1, 4, 16])}
    out["all-reduce"] = time_alternating({(name, m): (lambda fn=fn, b=b: fn(b)) for name, fn in
                                          algorithms.items() for m, b in buffers.items()}, repeats, 1)
    out["steps"], out["grad diffs"] = ddp_strategies(rank, 8 if quick else 16, repeats)
    return out


def ddp_strategies(rank, batch, repeats):
    gen = torch.Generator().manual_seed(rank)  # every node its own batch
    x, y = torch.randn(batch, 1, 28, 28, generator=gen), torch.randint(0, 10, (batch,), generator=gen)

    def bignet():  # the same weights everywhere; eval: no dropout, the same computation
        torch.manual_seed(0)
        return BigNet().eval()

    # NaiveDDP (lesson 07, step 1) calls sync.average_gradients after backward: one message.
    models = {"no communication": bignet(), "average_gradients": ddp_steps.NaiveDDP(bignet(), flat=True),
              "per-parameter hooks": ddp_steps.HookDDP(bignet()),
              "our DDP": ddp.DistributedDataParallel(bignet(), bucket_cap_mb=1),
              "torch DDP": torch.nn.parallel.DistributedDataParallel(bignet(), bucket_cap_mb=1)}

    def step(name):
        models[name].zero_grad(set_to_none=True)
        F.nll_loss(models[name](x), y).backward()  # the DDPs all-reduce buckets during this
        getattr(models[name], "finish_gradient_synchronization", lambda: None)()  # wait for it

    candidates = {name: (lambda n=name: step(n)) for name in models}
    candidates["forward only"] = lambda: F.nll_loss(models["no communication"](x), y)
    times = time_alternating(candidates, repeats=repeats, warmup=2)
    diffs = {n: max_diff([p.grad for p in models[n].parameters()], [p.grad for p in models["torch DDP"].parameters()])
             for n in ("average_gradients", "per-parameter hooks", "our DDP")}
    dist.barrier()  # torch's reducer finishes before anyone tears the group down
    return times, diffs


def report(out, rate_bits, p):
    rows, gbit = out["ping-pong"], lambda nbytes, s: nbytes * 8 / s / 1e9
    where = f"the {rate_bits / 1e9:g} Gbit/s link" if rate_bits else "loopback (no link: the CPU copies)"
    log(f"\n1. Ping-pong between rank 0 and rank 1 over {where}: one-way ms (Gbit/s)\n   " + ", ".join(
        f"{costmodel.human_bytes(r['bytes'])} {r['seconds'] * 1e3:.3f} ({gbit(r['bytes'], r['seconds']):.2f})" for r in rows))
    # tbf's token bucket (1 ms = 128 KiB at 1 Gbit/s) lets a message's first 128 KiB pass at
    # memory speed: 16-512 KiB look faster than the link. Fit to the sizes it cannot fool.
    fit = [r for r in rows if r["bytes"] <= 4096 or r["bytes"] >= MiB]
    alpha, beta = costmodel.fit_alpha_beta([r["bytes"] for r in fit], [r["seconds"] for r in fit])
    log(f"   fit (<= 4 KiB, >= 1 MiB): alpha = {alpha * 1e6:.0f} us, 1/beta = {8 / beta / 1e9:.3f} Gbit/s"
        + (f" = {8 / beta / rate_bits:.0%} of the link's rate (TCP/IP headers take ~3%)" if rate_bits else ""))
    log(f"\n2. All-reduce across {p} ranks: median ms (bus bandwidth, Gbit/s)")
    ar = {k: summarize(v)["median"] for k, v in out["all-reduce"].items()}
    for m in sorted({m for _, m in ar}):
        log(f"   {m:2d} MiB: " + " | ".join(f"{n} {s * 1e3:.1f} ms ({gbit(m * MiB * 2 * (p - 1) / p, s):.2f})"
                                           for (n, size), s in ar.items() if size == m))
    for name, diff in out["diffs"].items():
        log("   " + check(f"all-reduce over {p} ranks, {name}, vs the single-machine sum", diff, 1e-5))
    log("\n3. One training step of BigNet (median ms; DDPs with 1 MiB buckets):")
    st = {k: summarize(v)["median"] for k, v in out["steps"].items()}
    for name, s in ((n, s) for n, s in st.items() if n != "forward only"):  # forward: in 4.
        log(f"   {name:20s} {s * 1e3:7.1f} ms   {st['average_gradients'] / s:4.2f}x the speed of average_gradients")
    for name, diff in out["grad diffs"].items():
        log("   " + check(f"gradients, {name} vs torch DDP", diff, 1e-6))
    nbytes = 4 * sum(q.numel() for q in BigNet().parameters())
    forward, compute = st["forward only"], st["no communication"]
    log(f"\n4. Cost model: compute {compute * 1e3:.1f} ms (forward {forward * 1e3:.1f}), all-reduce of "
        f"{nbytes / 1e6:.1f} MB predicted {costmodel.predict_all_reduce('ring', nbytes, p, alpha, beta) * 1e3:.1f} ms")
    after, _ = costmodel.predict_step(compute, nbytes, p, "ring", alpha, beta)
    # Only backward can hide communication: forward comes first, then max(backward, comm).
    hidden, _ = costmodel.predict_step(compute - forward, nbytes, p, "ring", alpha, beta, overlap=True)
    for name, predicted in (("average_gradients", after), ("our DDP", forward + hidden)):
        log(f"   {name:18s} predicted {predicted * 1e3:6.1f} ms, measured {st[name] * 1e3:6.1f} ms "
            f"({predicted / st[name] - 1:+.0%})")


def recorded(why, args):
    with open(os.path.join(os.path.dirname(__file__), "..", "figures", "cluster.csv"), newline="") as f:
        log(f"No cluster here: {why}\nWhat the figures' benchmark recorded on "
            f"{f.readline().lstrip('# ').strip()}:")
        for row in csv.DictReader(f):  # part, name, bytes, seconds (median), min, max, max_diff
            log(f"   {row['part']:12s} {row['name']:25s}" + (f"{costmodel.human_bytes(int(row['bytes'])):>9s} "
                f"{float(row['seconds']) * 1e3:8.2f} ms" if row["seconds"] else ""))
    log("\nThe same measurements here, over loopback, for comparison:")
    report(launch(on_the_link, args.world_size, True, backend="gloo")[0], None, args.world_size)


def main():
    parser = lesson_parser(__doc__)
    parser.add_argument("--rate", default="1gbit", help="each link's speed (default 1gbit)")
    parser.add_argument("--in-node", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.world_size < 2:
        parser.error("across nodes takes 2 nodes or more: --world-size 2")
    if args.in_node:  # one rank per node, as under torchrun; node 0 prints the report
        results = launch(on_the_link, None, args.quick, backend="gloo")
        if results is not None and os.environ["RANK"] == "0":
            report(results[0], cluster.parse_rate(args.rate), int(os.environ["WORLD_SIZE"]))
        return
    if why := cluster.privilege_problem():
        return recorded(why, args)
    with cluster.Cluster(args.world_size, rate=args.rate) as c:
        # What torchrun --nproc-per-node 1 would set: one rank per node, one thread.
        cmd = ["env", "RANK=$NODE_RANK", "WORLD_SIZE=$NNODES", "OMP_NUM_THREADS=1", sys.executable,
               __file__, "--in-node", "--rate", args.rate] + (["--quick"] if args.quick else [])
        log(f"{c.n} nodes {', '.join(c.addresses)} on one bridge, every link {args.rate}; each "
            f"runs:\n   {' '.join(cmd)}\n   (measuring; node 0 reports)")
        c.run(cmd, timeout=1200)  # launch() times out a silent peer long before


if __name__ == "__main__":
    main()
