"""Lesson 11: across nodes - a real link, where communication costs more than computing.

On one machine (lessons 01-10) the "network" is the CPU copying bytes through loopback: every
byte sent costs the cores that compute, so nothing can overlap and nothing is link-bound. Here
the lesson builds a small cluster on this one machine (dist_sgd.scale.cluster): each node is a
Linux network namespace with its own network stack, plugged into a bridge (a switch) by a link
that `tc ... tbf` limits to 1 Gbit/s in each direction, like a cheap Ethernet port. Then it runs
this same file once in every node, as a cluster runs a job (it prints the command): started by
a launcher (RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set, as torchrun and the cluster set
them), the file is one rank and measures:

  1. ping-pong on the link: fit t = alpha + n * beta and compare 1/beta with the link's rate;
  2. one ring step's exchange (send to the right, receive from the left) in two orders: isend
     posted before recv (gloo writes the whole send from the caller's thread before the
     receive is posted, so the two directions take turns), and irecv posted before isend
     (both directions at once), next to gloo's own all-reduce and our library's ring; every
     result checked against what it must be (the neighbour's tensor, the single-machine sum);
  3. lesson 07's DDP strategies (steps 1 and 3) on BigNet (4.8 MB of gradients, ~40 ms on
     this link): an all-reduce after backward adds its whole time to the step; buckets
     all-reduced during backward can hide up to the length of backward - when the link, not
     the CPU, is what the step waits for. The benchmark (`python -m dist_sgd.bench cluster`)
     puts the cost model's predicted step times (from the fitted alpha and beta) beside these.

Needs root (network namespaces); without it the lesson says so, shows the numbers recorded in
figures/cluster.csv (the figures' benchmark measures them, see the README) and runs the same
measurements over loopback for comparison. Honest expectations: the nodes share this machine's
cores. Ping-pong and all-reduce are bound by the 1 Gbit/s link even on a busy machine; a
training step is not: on 2 cores with other work running, computing BigNet's step takes far
longer than its all-reduce, and gloo's sending thread competes with backward for a core, so
overlap gains little (compare the "no communication" row with the rest, and `uptime`'s load).

CPU only: the nodes are network namespaces of this machine and the lesson is about their
links, so its ranks use gloo and CPU tensors, GPUs or not.

Run:
    sudo python lessons/11_across_nodes.py             # 2 nodes at 1 Gbit/s
    sudo python lessons/11_across_nodes.py --quick     # small sizes, ~20 s
On a real cluster (or through `python -m dist_sgd.scale.cluster --nodes 2 -- '...'`) every lesson
runs with the commands a cluster uses, for instance on each of 2 machines:
    torchrun --nnodes 2 --node-rank $NODE_RANK --nproc-per-node 1 \\
             --master-addr $MASTER_ADDR --master-port $MASTER_PORT lessons/07_ddp_from_scratch.py

Exercises:
  1. Run with --rate 100mbit: which numbers scale by 10, which do not (alpha)?
  2. Why does an 8 MiB exchange with isend first take twice as long, although the link is full
     duplex? Reread lesson 02 on when a blocking recv is posted.
  3. Make the batch 4x smaller: what happens to the gain of the DDPs over average_gradients,
     and why? (Hint: how long is backward now, next to the all-reduce?)
"""
import csv
import os
import shlex
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

from dist_sgd.comm import collectives, p2p
from dist_sgd.ddp import ddp, steps
from dist_sgd.plumbing.check import check, max_diff
from dist_sgd.plumbing.launch import launch, lesson_parser
from dist_sgd.plumbing.rank import log, under_torchrun
from dist_sgd.plumbing.timing import summarize, time_alternating
from dist_sgd.scale import cluster, costmodel, netns
from dist_sgd.sgd.models import BigNet

MiB = 2 ** 20


def exchange(mine, incoming, recv_first):
    """One ring step: send `mine` to the right neighbour, receive `incoming` from the left."""
    r, p = dist.get_rank(), dist.get_world_size()
    if recv_first:  # the receive is waiting before a byte leaves: both directions at once
        request = dist.irecv(incoming, (r - 1) % p)
        dist.isend(mine, (r + 1) % p).wait()
    else:  # isend writes the whole tensor before recv is posted: the directions take turns
        request = dist.isend(mine, (r + 1) % p)
        dist.recv(incoming, (r - 1) % p)
    request.wait()


OPS = {"exchange, isend first": lambda t, inbox: exchange(t, inbox, recv_first=False),
       "exchange, irecv first": lambda t, inbox: exchange(t, inbox, recv_first=True),
       "all-reduce, our ring": lambda t, inbox: collectives.all_reduce(t),
       "all-reduce, gloo": lambda t, inbox: dist.all_reduce(t)}


def run(rank, world_size, args):
    """One rank per node: every measurement (node 0's result goes into the report)."""
    repeats = 3 if args.quick else 7
    sizes = [2 ** k for k in range(10, 23 if args.quick else 25, 2 if args.quick else 1)]
    out = {"ping-pong": p2p.ping_pong(sizes, repeats=repeats), "diffs": {}}  # 1 KiB .. 4/16 MiB
    # Every rank's input is known everywhere, so what each operation must give is too.
    inputs = [torch.randn(MiB, generator=torch.Generator().manual_seed(r))
              for r in range(world_size)]
    for name, op in OPS.items():
        t, inbox = inputs[rank].clone(), torch.empty(MiB)
        op(t, inbox)
        got, want = (inbox, inputs[rank - 1]) if "exchange" in name else (t, sum(inputs))
        out["diffs"][name] = max_diff(got, want)
    buffers = {m: (torch.ones(m * MiB // 4), torch.empty(m * MiB // 4))
               for m in ([1, 4] if args.quick else [1, 4, 16])}
    out["timed"] = time_alternating({(name, m): (lambda op=op, b=b: op(*b)) for name, op in
                                     OPS.items() for m, b in buffers.items()}, repeats, 1)
    out["steps"], out["grad diffs"] = ddp_strategies(rank, 8 if args.quick else 16, repeats)
    return out


def ddp_strategies(rank, batch, repeats):
    torch.manual_seed(rank)  # every node its own batch
    x, y = torch.randn(batch, 1, 28, 28), torch.randint(0, 10, (batch,))

    def bignet():  # the same weights everywhere; eval: no dropout, the same computation
        torch.manual_seed(0)
        return BigNet().eval()

    # NaiveDDP (lesson 07, step 1) calls sync.average_gradients after backward: one message.
    models = {"no communication": bignet(),
              "average_gradients": steps.NaiveDDP(bignet(), flat=True),
              "our DDP": ddp.DistributedDataParallel(bignet(), bucket_cap_mb=1),
              "torch DDP": torch.nn.parallel.DistributedDataParallel(bignet(), bucket_cap_mb=1)}

    def step(name):
        models[name].zero_grad(set_to_none=True)
        F.nll_loss(models[name](x), y).backward()  # the DDPs all-reduce buckets during this
        getattr(models[name], "finish_gradient_synchronization", lambda: None)()  # wait for it

    times = time_alternating({name: (lambda n=name: step(n)) for name in models}, repeats, 2)
    theirs = [p.grad for p in models["torch DDP"].parameters()]
    diffs = {n: max_diff([p.grad for p in models[n].parameters()], theirs)
             for n in ("average_gradients", "our DDP")}
    dist.barrier()  # torch's reducer finishes before anyone tears the group down
    return times, diffs


def report(out, rate_bits, p):
    rows, gbit = out["ping-pong"], lambda nbytes, s: nbytes * 8 / s / 1e9
    where = f"the {rate_bits / 1e9:g} Gbit/s link" if rate_bits else "loopback (the CPU copies)"
    log(f"\n1. Ping-pong between rank 0 and rank 1 over {where}: one-way ms (Gbit/s)\n   "
        + ", ".join(f"{costmodel.human_bytes(r['bytes'])} {r['seconds'] * 1e3:.3f} "
                    f"({gbit(r['bytes'], r['seconds']):.2f})" for r in rows))
    # tbf's token bucket (1 ms = 128 KiB at 1 Gbit/s) lets a message's first 128 KiB pass at
    # memory speed: 16-512 KiB look faster than the link. Fit to the sizes it cannot fool.
    fit = [r for r in rows if r["bytes"] <= 4096 or r["bytes"] >= MiB]
    alpha, beta = costmodel.fit_alpha_beta([r["bytes"] for r in fit], [r["seconds"] for r in fit])
    log(f"   fit (<= 4 KiB, >= 1 MiB): alpha = {alpha * 1e6:.0f} us per message")
    if beta <= 0:  # the fit keeps beta >= 0: 0 means these sizes could not resolve it
        log("   beta ~ 0: the cost of a byte is lost in the noise at these sizes")
    else:
        log(f"   1/beta = {8 / beta / 1e9:.3f} Gbit/s" + (f" = {8 / beta / rate_bits:.0%} of the "
            "link's rate (TCP/IP headers take ~3%)" if rate_bits else ""))
    log(f"\n2. A ring exchange and all-reduces, {p} ranks: median ms (Gbit/s per link and way)")
    timed = {k: summarize(v)["median"] for k, v in out["timed"].items()}
    for m in sorted({m for _, m in timed}):
        moved = {n: m * MiB * (1 if "exchange" in n else 2 * (p - 1) / p) for n in OPS}
        log(f"   {m:2d} MiB: " + " | ".join(f"{n} {s * 1e3:.1f} ({gbit(moved[n], s):.2f})"
                                           for (n, size), s in timed.items() if size == m))
    for name, diff in out["diffs"].items():  # an exchange: the left neighbour's tensor
        log("   " + check(f"{name} over {p} ranks vs the same on one machine", diff, 1e-5))
    log("\n3. One training step of BigNet (median ms; DDPs with 1 MiB buckets):")
    st = {k: summarize(v)["median"] for k, v in out["steps"].items()}
    for name, s in st.items():
        log(f"   {name:20s} {s * 1e3:7.1f} ms   {st['average_gradients'] / s:4.2f}x as fast as "
            "average_gradients")
    for name, diff in out["grad diffs"].items():
        log("   " + check(f"gradients, {name} vs torch DDP", diff, 1e-6))


def recorded(why, args):
    with open(os.path.join(os.path.dirname(__file__), "..", "figures", "cluster.csv")) as f:
        log(f"No cluster here: {why}\nWhat the figures' benchmark recorded on "
            f"{f.readline().lstrip('# ').strip()}:")
        for row in csv.DictReader(f):  # part, name, bytes, seconds (median), min, max, max_diff
            log(f"   {row['part']:12s} {row['name']:25s}" + (
                f"{costmodel.human_bytes(int(row['bytes'])):>9s} "
                f"{float(row['seconds']) * 1e3:8.2f} ms" if row["seconds"] else ""))
    log("\nThe same measurements here, over loopback, for comparison:")
    report(launch(run, args.world_size, args, backend="gloo")[0], None, args.world_size)


def main():
    parser = lesson_parser(__doc__)
    parser.add_argument("--rate", default="1gbit", help="each link's speed (default 1gbit)")
    args = parser.parse_args()
    if (int(os.environ["WORLD_SIZE"]) if under_torchrun() else args.world_size) < 2:
        parser.error("across nodes takes 2 nodes or more: --world-size 2")
    if under_torchrun():  # one rank of a job (in a node of ours, or on a real cluster)
        results = launch(run, None, args, backend="gloo")
        if results is not None:  # NODE_RANK: the cluster below set it, the link has our rate
            rate = cluster.parse_rate(args.rate) if "NODE_RANK" in os.environ else None
            report(results[0], rate, len(results))
        return
    if why := netns.privilege_problem():
        return recorded(why, args)
    mine = [os.path.relpath(__file__), "--rate", args.rate] + ["--quick"] * args.quick
    # What torchrun --nproc-per-node 1 would set in each node: one rank per node, one thread.
    each = f"env RANK=$NODE_RANK WORLD_SIZE=$NNODES OMP_NUM_THREADS=1 {sys.executable} "
    log(f"{args.world_size} nodes on one bridge, every link {args.rate}; the same as typing:\n"
        f"   python -m dist_sgd.scale.cluster --nodes {args.world_size} --rate {args.rate} -- "
        f"'{each}{shlex.join(mine)}'\n   (measuring; node 0 reports)")
    with cluster.Cluster(args.world_size, rate=args.rate) as c:
        c.run_ranks(mine, timeout=1200)  # launch() times out a silent peer long before


if __name__ == "__main__":
    main()
