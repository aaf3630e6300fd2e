"""Lesson 16: FSDP, the parameters, gradients and optimizer state all sharded (ZeRO-2, ZeRO-3).

Why DDP's memory does not shrink. With float32 and Adam every parameter costs 16 bytes: 4 for
itself, 4 for its gradient, 8 for Adam's two moments. DDP keeps all 16 on every rank: more
ranks train faster, never a bigger model. ZeRO-1 (lesson 13) shards the optimizer state, but
8 bytes stay on every rank. FSDP keeps only 1/p of each tensor on each rank:

  shard      each weight is flattened, padded with zeros to a multiple of p and cut into p
             equal pieces; rank r keeps piece r (and its gradient, and its Adam state)
  gather     just before a layer runs, the ranks all-gather its pieces into the full weight
  compute    the layer computes as usual...
  free       ...and the full weight is freed right after (ZeRO-3), or kept until its
             backward (ZeRO-2: one gather less, but every layer's full weights at once)
  reduce     in backward (gathered again under ZeRO-3) each weight's gradient is
             reduce-scattered: rank r receives the sum over ranks of piece r only, / p

The backward of an all-gather *is* a reduce-scatter: nobody needs more than its own piece of
the gradient, because it updates only its own piece. Bytes per parameter on each of N ranks
(Rajbhandari et al. 2020; ours also holds a few gathered layers at a time):

               params  grads  Adam state  total       bytes sent per step
    DDP          4       4        8       16          all-reduce: 2(N-1)/N per byte
    ZeRO-1       4       4       8/N      8 + 8/N     1.0x DDP's (reduce-scatter + all-gather)
    ZeRO-2       4      4/N      8/N      4 + 12/N    1.0x (gather once, reduce-scatter)
    ZeRO-3      4/N     4/N      8/N      16/N        <= 1.5x (gather, again, reduce-scatter)

ZeRO-3 sends up to half as much again as DDP; hiding that behind the computation is the
point of prefetch (FullyShardedDataParallel(prefetch=1)): while one layer computes, the next
layer's all-gather is already on the wire. Backward starts with the layers forward ended with,
before anything computes that could hide a gather: so those two (the last, and the one
prefetch would gather with it) stay gathered from their forward to their backward, as torch
keeps its root's. That holds no more at once than prefetch does anyway (the peak is the
same), and saves 2 of the 12 second gathers: 12 + 10 gathers and 12 reduce-scatters against
DDP's 12 all-reduces of twice the bytes, (12 + 10 + 12) / 24 = 1.42x.

This lesson: one weight sharded by hand; then, at world sizes 1-4, the bytes each rank holds,
counted tensor by tensor (the largest rank) next to the formula, the bytes each scheme sends
(counted from its collectives), and checks of our FSDP against one process, our DDP and
torch's fully_shard on the same batches. Here every parameter is sharded (shard_all=True, as
torch does); by default biases stay whole. The "+ layers" column is what ours holds besides
the formula: ZeRO-3 two layers gathered (the one computing and the next one prefetched, or
the two kept for backward) and one layer's gradient being reduced; ZeRO-2's formula
counts its gathered layers as the 4 bytes of parameters, so its own pieces (4/N) come on top.

Honest expectations: memory falls as 1/N anywhere. Time does not, here: the ranks share 2
cores and one memory, so the sharded runs only add copying. On GPUs, or on a link where the
gathers hide behind computation, the saved memory buys a bigger model. The figures' benchmark
(`python -m dist_sgd.bench fsdp`, as root) times a step on two emulated nodes at 1 Gbit/s.

Run:
    python lessons/16_fsdp.py                      # world sizes 1, 2, 3, 4
    python lessons/16_fsdp.py --quick              # tiny layers, world sizes 1 and 2
    python lessons/16_fsdp.py --world-size 3       # one world size
    torchrun --standalone --nproc-per-node 2 lessons/16_fsdp.py

Exercises:
  1. by_hand's weight has 385 x 385 elements: at --world-size 3, where does the padding go,
     and why must every piece have the same size?
  2. Set prefetch=0: the peak buffers drop by one layer. What did prefetch buy?
  3. 7.5 B parameters on 64 GPUs with 80 GB each: which of the four rows fits? (K = 12 with
     float16 compute: 2 + 2 + 12 bytes per parameter.)
  4. Write one FSDP unit's gather, free and reduce-scatter yourself, checked against torch's
     collectives: python3 -m dist_sgd.course start fsdp_unit
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard

from dist_sgd.comm import collectives
from dist_sgd.ddp.ddp import DistributedDataParallel as DDP
from dist_sgd.plumbing.check import check, max_diff
from dist_sgd.plumbing.launch import launch, lesson_parser
from dist_sgd.plumbing.rank import device, log, under_torchrun
from dist_sgd.shard.fsdp import FullyShardedDataParallel as FSDP
from dist_sgd.comm.counted import Counted
from dist_sgd.shard.zero import ShardedOptimizer

STEPS, LR = 3, 1e-3
FORMULA = {"DDP": lambda n: 16, "ZeRO-1": lambda n: 8 + 8 / n, "ZeRO-2": lambda n: 4 + 12 / n,
           "ZeRO-3": lambda n: 16 / n}


def make_model(width, depth, dtype=torch.float32):
    torch.manual_seed(0)  # the same start on every rank
    return nn.Sequential(*[nn.Linear(width, width) for _ in range(depth)]).to(device(), dtype)


def by_hand(rank, p, width):
    """One weight the FSDP way, with our collectives: keep a piece, gather, compute, reduce."""
    w = torch.randn(width + 1, width + 1, generator=torch.Generator().manual_seed(0)).to(device())
    size = -(-w.numel() // p)  # ceil(n / p): every piece equal, the last ones padded
    pad = torch.zeros(size * p - w.numel(), device=w.device)  # NCCL: on this rank's GPU
    piece = torch.cat([w.flatten(), pad])[rank * size:(rank + 1) * size]  # all a rank keeps
    pieces = [torch.empty(size, device=w.device) for _ in range(p)]
    collectives.all_gather(pieces, piece)
    full = torch.cat(pieces)[:w.numel()].view_as(w).requires_grad_()
    x = torch.randn(4, width + 1, generator=torch.Generator().manual_seed(rank)).to(w.device)
    (x @ full.T).square().mean().backward()  # after this, `full` could be freed
    grad, mine = torch.cat([full.grad.flatten(), pad]), torch.empty(size, device=w.device)
    collectives.reduce_scatter(mine, list(grad.split(size)))  # the sum of piece `rank` only
    everyone = grad.clone()
    dist.all_reduce(everyone)  # DDP's way: every rank gets all of it
    return {"by hand: the all-gathered pieces vs the weight": max_diff(full, w),
            "by hand: the reduce-scattered piece vs the all-reduced gradient's":
                max_diff(mine, everyone[rank * size:(rank + 1) * size])}


def schemes(rank, world_size, width, depth):
    """Bytes held after two Adam steps (tensor by tensor), and bytes sent in the second."""
    out, counted = {}, Counted()  # a counting all_reduce: DDP's bytes from its collectives
    x = torch.randn(8, width, generator=torch.Generator().manual_seed(rank)).to(device())
    for name in FORMULA:
        net = model = make_model(width, depth)
        if name == "DDP":
            net = DDP(model, all_reduce=lambda t: counted.start("all_reduce", t).wait())
        elif name != "ZeRO-1":  # every parameter sharded, so the formulas hold as written
            net = FSDP(model, reshard_after_forward=name == "ZeRO-3", shard_all=True)
        opt = (ShardedOptimizer(model.parameters(), torch.optim.Adam, "all_gather", lr=LR)
               if name == "ZeRO-1" else torch.optim.Adam(net.parameters(), lr=LR))
        for _ in range(2):
            counted.log.clear()
            opt.zero_grad(set_to_none=False)
            F.mse_loss(net(x), x).backward()
            opt.step()
        count = lambda ts: sum(t.numel() * t.element_size() for t in ts)  # noqa: E731
        params, fsdp = list(net.parameters()), name in ("ZeRO-2", "ZeRO-3")
        out[name] = [count(params), count(p.grad for p in params),
                     count(v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)),
                     net.memory()["peak_buffers"] if fsdp else 0,
                     counted.bytes_sent(world_size) if name == "DDP" else (
                         net if fsdp else opt).bytes_per_step()]
    return out


def checks(rank, world_size, width, depth):
    """Our FSDP against one process, our DDP and torch's fully_shard, in float64."""
    new = lambda: make_model(width, depth, torch.float64)  # noqa: E731
    theirs = new()
    for layer in theirs:
        fully_shard(layer)
    models = {"one process": new(), "ZeRO-3": FSDP(new()), "our DDP": DDP(new()),
              "ZeRO-2": FSDP(new(), reshard_after_forward=False),
              "ZeRO-3, our collectives": FSDP(new(), collectives="ours"),
              "torch's fully_shard": fully_shard(theirs)}
    opts = {k: torch.optim.Adam(m.parameters(), lr=LR) for k, m in models.items()}
    for step in range(STEPS):  # every rank makes the global batch and takes its own part
        x = torch.randn(4 * world_size, width, generator=torch.Generator().manual_seed(step),
                        dtype=torch.float64).to(device())
        for name, m in models.items():
            opts[name].zero_grad()
            mine = x if name == "one process" else x[4 * rank:4 * rank + 4]
            F.mse_loss(m(mine), mine.tanh()).backward()
            opts[name].step()
    full = {k: list(m.gather_full_params().values()) if "ZeRO" in k else
            [p.full_tensor() if hasattr(p, "full_tensor") else p for p in m.parameters()]
            for k, m in models.items()}
    out = {f"weights after {STEPS} Adam steps, {k} vs one process": max_diff(v, full["one process"])
           for k, v in full.items() if k != "one process"}
    out[f"weights after {STEPS} Adam steps, ZeRO-3 vs torch's fully_shard"] = max_diff(
        full["ZeRO-3"], full["torch's fully_shard"])
    return out


def run(rank, world_size, args):
    width, depth = (36, 12) if args.quick else (384, 12)
    out = {"schemes": schemes(rank, world_size, width, depth),
           "checks": {**by_hand(rank, world_size, width), **checks(rank, world_size, width, depth)}}
    dist.barrier()  # our DDP's last reduction done on every rank before the group goes
    return out


def report(world_size, results, width, depth):
    n, kib, unit = depth * width * (width + 1), 1024, width * (width + 1) * 4  # unit: a layer
    extra = {"ZeRO-2": 4 / world_size * n, "ZeRO-3": 3 * unit}  # what ours holds besides
    log(f"\n=== world size {world_size}: KiB per rank (the largest rank) ===\n{'':7s} "
        + " ".join(f"{h:>8s}" for h in ("params", "grads", "Adam", "buffers", "total", "formula"))
        + "  + layers  measured / (formula + layers)")
    for name in FORMULA:
        held = max((r["schemes"][name][:4] for r in results), key=sum)
        want = FORMULA[name](world_size) * n
        log(f"{name:7s} " + " ".join(f"{b / kib:8.1f}" for b in held + [sum(held), want])
            + f"  {extra.get(name, 0) / kib:8.1f}  {sum(held) / (want + extra.get(name, 0)):.3f}x")
    ddp = results[0]["schemes"]["DDP"][4]
    log("bytes each rank sends per step, counted, per DDP byte (ZeRO-3: 2 layers kept):")
    for name in FORMULA:
        sent = results[0]["schemes"][name][4]
        log(f"  {name:7s} {sent / kib:10.1f} KiB  " + (f"{sent / ddp:.2f}x" if ddp else "-"))
    for name in results[0]["checks"]:  # the largest difference over every rank; float64: 1e-9
        tolerance = 1e-6 if name.startswith("by hand") else 1e-9
        log(check(name, max(r["checks"][name] for r in results), tolerance))


def main():
    args = lesson_parser(__doc__, world_size=[1, 2, 3, 4]).parse_args()
    width, depth = (36, 12) if args.quick else (384, 12)
    sizes = [1, 2] if args.quick and args.world_size == [1, 2, 3, 4] else args.world_size
    sizes = [int(os.environ["WORLD_SIZE"])] if under_torchrun() else sizes  # its group, made
    log(f"model: {depth} x Linear({width}, {width}) = {depth * width * (width + 1):,} float32 "
        f"parameters; Adam (lr {LR})")
    for ws in sizes:
        results = launch(run, ws, args, backend=args.backend)
        if results is not None:
            report(ws, results, width, depth)
    log("\nThe ranks share this machine's cores: sharding saves memory here, not time.")
    log("\n" + __doc__[__doc__.index("Exercises:"):].rstrip())


if __name__ == "__main__":
    main()
