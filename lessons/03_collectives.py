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

For each one this lesson runs torch's version first, then ours, written with nothing but
isend/irecv (broadcast, all_gather and reduce_scatter from dist_sgd.comm.textbook, as short
as a textbook's; the others from dist_sgd.comm.collectives), shows who ends with what, and
checks that ours equals torch's (the max difference over all ranks is printed; it is 0
where no float rounding is involved). Each rank r starts with the tensor [10r, 10r+1,
10r+2, 10r+3], so sums are easy to check by eye. all_reduce takes any op torch's gloo has
(SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR); ours refuses what gloo refuses (AVG of
integers, bitwise ops on floats) before sending anything. Lesson 04 opens up all_reduce: its
algorithms and costs.

Run (from the repository root):
    python lessons/03_collectives.py --world-size 4
    torchrun --standalone --nproc-per-node 4 lessons/03_collectives.py
    DIST_SGD_VERBOSE=1 python lessons/03_collectives.py --world-size 2 --quick   # every message

Exercises:
  0. Write three of them yourself: `python3 -m dist_sgd.course start broadcast` (then
     `... course start all_gather` and `... course start reduce_scatter`) gives you the
     function with its body to write, `... check broadcast` grades it against torch's at world
     sizes 1-4 (odd sizes, src other than 0, bytes per rank counted), and `DIST_SGD_MINE=mine
     python3 lessons/03_collectives.py` runs this lesson on yours.
  1. With DIST_SGD_VERBOSE=1, count the messages reduce sends for 2, 3, 4 and 8 ranks.
     Why is it p-1 messages but only ceil(log2 p) rounds? Which rank receives the most?
  2. Build all_reduce from the others: reduce then broadcast, or reduce_scatter then
     all_gather. Check both against dist.all_reduce. Which sends fewer bytes per rank?
  3. torch's reduce leaves the non-dst ranks' tensors undefined (gloo overwrites them with
     partial sums; the printout shows it). Why might a library allow that? What does ours
     pay to keep them intact?
  4. Write all_to_all (rank i sends list[j] to rank j, receives list[i] from each) from
     isend/irecv, and check it against dist.all_to_all... on a backend that has it.
"""

import time

import torch
import torch.distributed as dist

from dist_sgd.comm import collectives as ours, textbook
from dist_sgd.plumbing.check import check, max_diff
from dist_sgd.plumbing.launch import launch, lesson_parser
from dist_sgd.plumbing.rank import device, log


def each_rank(t):
    """Every rank's value of t (a tensor, a list of tensors or None), in rank order."""
    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, t.tolist() if isinstance(t, torch.Tensor)
                           else t and [x.tolist() for x in t])
    return values


def fmt(v):
    if v is None or not v or not isinstance(v[0], list):  # None, or a list of numbers
        return "-" if v is None else "[" + " ".join(f"{x:g}" for x in v) + "]"
    return "[" + ", ".join(fmt(x) for x in v) + "]"


def show(label, t):
    for r, v in enumerate(each_rank(t)):
        log(f"    {label} on rank {r}: {fmt(v)}")


def compare(what, got, expected, tolerance=0.0, here=True):
    """Ours vs torch's (tensors or lists of them), on every rank where `here`: the largest
    difference over all ranks."""
    diffs = each_rank(torch.tensor(max_diff(got, expected) if here else 0.0))
    log(check(f"{what} vs torch", max(diffs), tolerance))


def section(title, picture):
    log(f"\n== {title} " + "=" * (72 - len(title)))
    for line in picture.strip("\n").splitlines():
        log("  " + line)


def run(rank, size, args):
    dev = device()
    root = size - 1  # a root other than 0: the algorithms must not assume rank 0
    mine = lambda: torch.arange(4, dtype=torch.float32, device=dev) + 10 * rank  # noqa: E731
    log(f"{size} ranks, backend {dist.get_backend()}; rank r starts with [10r 10r+1 10r+2 10r+3]; "
        f"the pictures: 3 ranks, root r2 (here the root is rank {root})")

    section(f"broadcast(tensor, src={root})", """
before: r0 [A]  r1 [B]  r2 [C]       after: r0 [C]  r1 [C]  r2 [C]
down a binomial tree: the src sends to one rank, then both send, then all four...""")
    t, o = mine(), mine()
    dist.broadcast(t, src=root)
    textbook.broadcast(o, root)
    show("ours", o)
    compare("broadcast", o, t)

    section(f"reduce(tensor, dst={root}, op=SUM)", """
before: r0 [A]  r1 [B]  r2 [C]       after: r2 [A+B+C], the others: unchanged (ours)
up the same tree, adding as it goes: partial sums meet at the dst""")
    t, o = mine(), mine()
    dist.reduce(t, dst=root)
    ours.reduce(o, dst=root)
    show("torch", t)
    show("ours ", o)
    log("    (only the dst's result is defined: torch's gloo may leave partial sums elsewhere)")
    compare("reduce", o, t, here=(rank == root))

    section("all_reduce(tensor, op=...) with SUM, AVG and MAX", """
before: r0 [A]  r1 [B]  r2 [C]       after: everyone [A+B+C]  (AVG: divided by 3)
ours: ring reduce-scatter + all-gather over chunks (lesson 04 shows the steps)""")
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.MAX):
        t, o = mine(), mine()
        dist.all_reduce(t, op=op)
        ours.all_reduce(o, op=op)
        show(f"ours {op.name}", o)
        compare(f"all_reduce {op.name}", o, t, 1e-6)

    section(f"scatter(tensor, scatter_list, src={root})", """
before: r2 holds [X0, X1, X2]        after: r0 [X0]  r1 [X1]  r2 [X2]
the src sends piece i to rank i, all at once (isend), keeping its own""")
    pieces = [torch.arange(2.0, device=dev) + 100 * i for i in range(size)]
    t, o = torch.zeros(2, device=dev), torch.zeros(2, device=dev)
    dist.scatter(t, pieces if rank == root else None, src=root)
    ours.scatter(o, pieces if rank == root else None, src=root)
    show("ours", o)
    compare("scatter", o, t)

    section(f"gather(tensor, gather_list, dst={root})", """
before: r0 [A]  r1 [B]  r2 [C]       after: r2 holds [A, B, C]
everyone sends to the dst, which posts all its receives at once (irecv)""")
    t_list = [torch.zeros(4, device=dev) for _ in range(size)] if rank == root else None
    o_list = [torch.zeros(4, device=dev) for _ in range(size)] if rank == root else None
    dist.gather(mine(), t_list, dst=root)
    ours.gather(mine(), o_list, dst=root)
    show("ours", o_list)
    compare("gather", o_list, t_list, here=(rank == root))

    section("all_gather(tensor_list, tensor)", """
before: r0 [A]  r1 [B]  r2 [C]       after: everyone [A, B, C]
ours: the ring's second phase: p-1 steps, each rank forwards what it got last""")
    t_list, o_list = [mine() * 0 for _ in range(size)], [mine() * 0 for _ in range(size)]
    dist.all_gather(t_list, mine())
    textbook.all_gather(o_list, mine())
    show("ours", o_list)
    compare("all_gather", o_list, t_list)

    section("reduce_scatter(output, input_list, op=SUM)", """
before: r0 [A0 A1 A2]  r1 [B0 B1 B2]  r2 [C0 C1 C2]
after:  r0 [A0+B0+C0]  r1 [A1+B1+C1]  r2 [A2+B2+C2]
ours: the ring's first phase: p-1 steps, each adds the piece it receives and passes it on""")
    inputs = [torch.arange(2.0, device=dev) + 10 * rank + 100 * i for i in range(size)]
    t, o = torch.zeros(2, device=dev), torch.zeros(2, device=dev)
    dist.reduce_scatter(t, inputs)
    textbook.reduce_scatter(o, inputs)
    for r, (given, got) in enumerate(zip(each_rank(inputs), each_rank(o))):
        log(f"    rank {r}: input_list {fmt(given)}  ->  output {fmt(got)}")
    compare("reduce_scatter", o, t, 1e-6)

    section("barrier()", """
rank r arrives r x 0.2 s late; nobody leaves before the last one arrives
ours: a dissemination barrier, ceil(log2 p) rounds of tiny messages""")
    start = time.time()
    ours.barrier()  # line up first, so the clocks below start together
    time.sleep(0.2 * rank)
    arrived = time.time() - start
    ours.barrier()
    times = each_rank(torch.tensor([arrived, time.time() - start], dtype=torch.float64))
    for r, (a, b) in enumerate(times):
        log(f"    rank {r}: arrived at {a:5.2f} s, left at {b:5.2f} s")
    log(check("barrier: latest arrival minus earliest departure (s)",
              max(0.0, max(a for a, _ in times) - min(b for _, b in times)), 0.05))

    n = 1001 if args.quick else 1 << 20
    section(f"the same on {n:,} random float32 numbers per rank (sums in another order: "
            "last bits)", "")
    x = torch.randn(n, generator=torch.Generator().manual_seed(rank)).to(dev)
    t, o = x.clone(), x.clone()
    dist.all_reduce(t)
    ours.all_reduce(o)
    compare("all_reduce (random)", o, t, 1e-5)
    chunks = [c.contiguous() for c in x[:n - n % size].chunk(size)]
    t, o = torch.empty_like(chunks[0]), torch.empty_like(chunks[0])
    dist.reduce_scatter(t, chunks)
    ours.reduce_scatter(o, chunks)
    compare("reduce_scatter (random)", o, t, 1e-5)


def main():
    args = lesson_parser(__doc__, world_size=4).parse_args()
    launch(run, args.world_size, args, backend=args.backend)


if __name__ == "__main__":
    main()
