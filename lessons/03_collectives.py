"""Lesson 03: collectives - every one of torch.distributed's, then ours, built from send/recv.

A collective is a communication that every rank of the group calls together. Point-to-point
(lesson 02) moves one tensor between two ranks; a collective moves data among all of them in
a pattern with a name. Data-parallel training needs mostly one (all_reduce: sum the
gradients everywhere), but the others are the vocabulary every distributed program uses:

    broadcast       src's tensor -> everyone                   (send the initial weights)
    reduce          op(everyone's tensors) -> dst only         (a loss total for logging)
    all_reduce      op(everyone's tensors) -> everyone         (average the gradients)
    scatter         src's list[i] -> rank i                    (hand out work)
    gather          everyone's tensor -> dst's list            (collect results)
    all_gather      everyone's tensor -> everyone's list       (sharded weights, ZeRO)
    reduce_scatter  op(everyone's list[i]) -> rank i           (all_reduce's first half)
    barrier         nobody leaves before everyone arrived      (line up before timing)

For each one this lesson runs torch's version first, then ours from dist_sgd.collectives
(written with nothing but send/recv/isend/irecv), shows who ends with what, and checks that
ours equals torch's (the max difference is printed; it is 0 where no float rounding is
involved). Each rank r starts with the tensor [10r, 10r+1, 10r+2, 10r+3], so sums are easy
to check by eye. Lesson 04 opens up all_reduce: four algorithms and what each costs.

Run (from the repository root):
    python lessons/03_collectives.py --world-size 4
    torchrun --standalone --nproc-per-node 4 lessons/03_collectives.py
    DIST_SGD_VERBOSE=1 python lessons/03_collectives.py --world-size 2 --quick   # every message

Exercises:
  1. With DIST_SGD_VERBOSE=1, count the messages broadcast sends for 2, 3, 4 and 8 ranks.
     Why is it p-1 messages but only ceil(log2 p) rounds? Which rank sends the most?
  2. Build all_reduce from the others: reduce then broadcast, or reduce_scatter then
     all_gather. Check both against dist.all_reduce. Which sends fewer bytes per rank?
  3. torch's reduce leaves the non-dst ranks' tensors undefined (gloo overwrites them with
     partial sums; the printout shows it). Why might a library allow that? What does ours
     pay to keep them intact?
  4. Write all_to_all (rank i sends list[j] to rank j, receives list[i] from each) from
     isend/irecv, and check it against dist.all_to_all... on a backend that has it.
"""
import os
import sys
import time

import torch
import torch.distributed as dist

from dist_sgd import collectives as ours  # noqa: E402
from dist_sgd.launch import device, launch, lesson_parser, log  # noqa: E402


def each_rank(t):
    """Every rank's value of t (a tensor, a list of tensors or None), in rank order."""
    if isinstance(t, torch.Tensor):
        t = t.tolist()
    elif isinstance(t, list):
        t = [x.tolist() for x in t]
    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, t)
    return values


def show(label, t):
    for r, v in enumerate(each_rank(t)):
        log(f"    {label} on rank {r}: {fmt(v)}")


def fmt(v):
    if v is None:
        return "-"
    if v and isinstance(v[0], list):
        return "[" + ", ".join(fmt(x) for x in v) + "]"
    return "[" + " ".join(f"{x:g}" for x in v) + "]"


def max_diff(a, b, here=True):
    """Largest |a - b| over the ranks where `here` (tensors or lists of them), each checked
    with assert_close. Every rank must call it: the maximum is itself an all_reduce."""
    d = torch.zeros(1, dtype=torch.float64, device=device())
    if here:
        a, b = (torch.stack(a) if isinstance(a, list) else a), (torch.stack(b) if isinstance(b, list) else b)
        torch.testing.assert_close(a, b)
        d[0] = (a - b).abs().max().double()
    dist.all_reduce(d, op=dist.ReduceOp.MAX)
    return d.item()


def section(title, picture):
    log(f"\n== {title} " + "=" * (72 - len(title)))
    for line in picture.strip("\n").splitlines():
        log("  " + line)


def lesson(rank, size, quick):
    dev = device()
    root = size - 1  # a root other than 0: the algorithms must not assume rank 0
    mine = lambda: torch.arange(4, dtype=torch.float32, device=dev) + 10 * rank  # noqa: E731
    worst = {}
    log(f"{size} ranks; each rank r starts with [10r 10r+1 10r+2 10r+3]; backend {dist.get_backend()}")
    log(f"(the pictures are drawn for 3 ranks with the last one, r2, as root; here the root is "
        f"rank {root})")

    section(f"broadcast(tensor, src={root})", """
before: r0 [A]  r1 [B]  r2 [C]       after: r0 [C]  r1 [C]  r2 [C]
down a binomial tree: the src sends to one rank, then both send, then all four...""")
    t, o = mine(), mine()
    dist.broadcast(t, src=root)
    ours.broadcast(o, src=root)
    show("ours", o)
    worst["broadcast"] = max_diff(o, t)

    section(f"reduce(tensor, dst={root}, op=SUM)", """
before: r0 [A]  r1 [B]  r2 [C]       after: r2 [A+B+C], the others: unchanged (ours)
up the same tree, adding as it goes: partial sums meet at the dst""")
    t, o = mine(), mine()
    dist.reduce(t, dst=root)
    ours.reduce(o, dst=root)
    show("torch", t)
    show("ours ", o)
    log("    (only the dst's result is defined: torch's gloo leaves partial sums elsewhere)")
    worst["reduce"] = max_diff(o, t, here=(rank == root))

    section("all_reduce(tensor, op=SUM) and op=MAX", """
before: r0 [A]  r1 [B]  r2 [C]       after: everyone [A+B+C]
ours: ring reduce-scatter + all-gather over chunks (lesson 04 shows the steps)""")
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX):
        t, o = mine(), mine()
        dist.all_reduce(t, op=op)
        ours.all_reduce(o, op=op)
        show(f"ours {op.name}", o)
        worst[f"all_reduce {op.name}"] = max_diff(o, t)

    section(f"scatter(tensor, scatter_list, src={root})", """
before: r2 holds [X0, X1, X2]        after: r0 [X0]  r1 [X1]  r2 [X2]
the src sends piece i to rank i, all at once (isend), keeping its own""")
    pieces = [torch.full((2,), 100.0 * i, device=dev) + torch.arange(2.0, device=dev) for i in range(size)]
    t, o = torch.zeros(2, device=dev), torch.zeros(2, device=dev)
    dist.scatter(t, pieces if rank == root else None, src=root)
    ours.scatter(o, pieces if rank == root else None, src=root)
    show("ours", o)
    worst["scatter"] = max_diff(o, t)

    section(f"gather(tensor, gather_list, dst={root})", """
before: r0 [A]  r1 [B]  r2 [C]       after: r2 holds [A, B, C]
everyone sends to the dst, which posts all its receives at once (irecv)""")
    t_list = [torch.zeros(4, device=dev) for _ in range(size)] if rank == root else None
    o_list = [torch.zeros(4, device=dev) for _ in range(size)] if rank == root else None
    dist.gather(mine(), t_list, dst=root)
    ours.gather(mine(), o_list, dst=root)
    show("ours", o_list)
    worst["gather"] = max_diff(o_list, t_list, here=(rank == root))

    section("all_gather(tensor_list, tensor)", """
before: r0 [A]  r1 [B]  r2 [C]       after: everyone [A, B, C]
ours: the ring's second phase: p-1 steps, each rank forwards what it got last""")
    t_list = [torch.zeros(4, device=dev) for _ in range(size)]
    o_list = [torch.zeros(4, device=dev) for _ in range(size)]
    dist.all_gather(t_list, mine())
    ours.all_gather(o_list, mine())
    show("ours", o_list)
    worst["all_gather"] = max_diff(o_list, t_list)

    section("reduce_scatter(output, input_list, op=SUM)", """
before: r0 [A0 A1 A2]  r1 [B0 B1 B2]  r2 [C0 C1 C2]
after:  r0 [A0+B0+C0]  r1 [A1+B1+C1]  r2 [A2+B2+C2]
ours: the ring's first phase: p-1 steps, each adds the piece it receives and passes it on""")
    inputs = [mine() + 1000 * i for i in range(size)]
    t, o = torch.zeros(4, device=dev), torch.zeros(4, device=dev)
    dist.reduce_scatter(t, inputs)
    ours.reduce_scatter(o, inputs)
    show("ours", o)
    worst["reduce_scatter"] = max_diff(o, t)

    section("barrier()", """
rank r arrives r x 0.2 s late; nobody leaves before the last one arrives
ours: a dissemination barrier, ceil(log2 p) rounds of tiny messages""")
    start = time.time()
    ours.barrier()  # line up first, so the clocks below start together
    time.sleep(0.2 * rank)
    arrived = time.time() - start
    ours.barrier()
    left = time.time() - start
    for r, (a, b) in enumerate(each_rank(torch.tensor([arrived, left], dtype=torch.float64))):
        log(f"    rank {r}: arrived at {a:5.2f} s, left at {b:5.2f} s")
    latest = max(a for a, _ in each_rank(torch.tensor([arrived, left], dtype=torch.float64)))
    assert left >= latest - 0.05, "barrier let a rank go before everyone arrived"

    n = 1001 if quick else 1 << 20
    section(f"the same checks on {n:,} random float32 numbers per rank", "")
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(n, generator=g).to(dev)
    for name, run in (("broadcast", lambda f, t: f(t, src=root)),
                      ("all_reduce", lambda f, t: f(t))):
        t, o = x.clone(), x.clone()
        run(getattr(dist, name), t)
        run(getattr(ours, name), o)
        worst[f"{name} (random)"] = max_diff(o, t)
    t_list = [torch.empty_like(x) for _ in range(size)]
    o_list = [torch.empty_like(x) for _ in range(size)]
    dist.all_gather(t_list, x)
    ours.all_gather(o_list, x)
    worst["all_gather (random)"] = max_diff(o_list, t_list)
    chunks = list(x.chunk(size)) if n % size == 0 else [x[:n // size].clone() for _ in range(size)]
    t, o = torch.empty_like(chunks[0]), torch.empty_like(chunks[0])
    dist.reduce_scatter(t, [c.contiguous() for c in chunks])
    ours.reduce_scatter(o, chunks)
    worst["reduce_scatter (random)"] = max_diff(o, t)

    log("\nmax difference, ours vs torch.distributed (summed floats may differ in the last bit:")
    log("we add in a different order; everything else must be exactly equal):")
    for name, d in worst.items():
        log(f"    {name:26s} {d:.3g}")
    log(f"all collectives match torch: max difference {max(worst.values()):.3g}")


def main():
    args = lesson_parser(__doc__, world_size=4).parse_args()
    launch(lesson, args.world_size, args.quick, backend=args.backend)


if __name__ == "__main__":
    main()
