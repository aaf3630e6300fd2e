"""Lesson 13: ZeRO-1, the optimizer state sharded across ranks.

Data parallelism (lessons 06-09) keeps on every rank a full copy of three things: the
parameters, their gradients, and the optimizer's state. Adam's state is two tensors per
parameter (exp_avg, exp_avg_sq), so it is the biggest of the three. Per parameter, in bytes
(float32: 4 for the parameter, 4 for its gradient, K = 8 for Adam's state):

    plain data parallel:  4 + 4 + K   = 16 bytes on every rank
    ZeRO-1 on p ranks:    4 + 4 + K/p                       (Rajbhandari et al. 2020)

ZeRO stage 1 cuts the parameters into p shards (whole tensors, balanced by size, the same
partition on every rank) and gives rank r the optimizer of shard r only. One step:

    loss.backward()                       # every rank: gradients of its own batch
    opt = ShardedOptimizer(params, torch.optim.Adam, scheme=..., lr=...)   # once
    opt.step()    # 1. gradients averaged (each rank needs only its own shard's)
                  # 2. Adam updates this rank's shard, with this rank's state
                  # 3. every rank gets every updated shard

Steps 1 and 3 are the communication, in two schemes (dist_sgd/shard/zero.py), N = gradient bytes:
  broadcast  (torch's ZeroRedundancyOptimizer): all-reduce all gradients, 2(p-1)/p N per
             rank, then each rank broadcasts its shard, (p-1)/p N: 1.5x plain data parallel.
  all_gather (DeepSpeed's): reduce-scatter, so a rank receives only its shard's average,
             (p-1)/p N, then all-gather the parameters, (p-1)/p N: the same 1.0x as plain.
Under our DDP the gradients arrive averaged already, so both schemes skip step 1
(reduce_gradients=False: averaging twice wastes an all-reduce) and pay 1.5x in total.

The lesson measures, at each world size: the bytes each rank holds (counted tensor by tensor)
next to the formula; the bytes each scheme sends per step (counted from the collectives it
calls); the time per step; and it checks that the weights equal plain Adam's after 3 steps.
Honest expectations here: memory falls as 1/p on any machine. Time does not: on 2 cores the
ranks share the processor, so more ranks are slower, and ZeRO adds communication; on GPUs
the saved memory buys a larger model or batch, which is what ZeRO is for.

Run:
    python lessons/13_zero.py                      # world sizes 1, 2, 3, 4
    python lessons/13_zero.py --quick              # tiny model, world sizes 1, 2, 3, 4
    python lessons/13_zero.py --world-size 3       # one world size
    torchrun --standalone --nproc-per-node 2 lessons/13_zero.py

Exercises:
  0. Write the ZeRO-1 step yourself: `python3 -m dist_sgd.course start ShardedOptimizer`,
     then `... check ShardedOptimizer` grades it against plain Adam at world sizes 1-4 (the
     weights on every rank, the state on one rank each), and `DIST_SGD_MINE=mine python3
     lessons/13_zero.py` runs this lesson on yours.
  1. Make the model one large and one small layer (depth 1 plus a head): how unequal are the
     shards now? Why does ZeRO-1 cut whole parameters, and what does DeepSpeed do instead?
  2. Run with scheme="all_gather" under our DDP (reduce_gradients=False). Where did the 1.0x go?
  3. With mixed precision, the paper counts 2 + 2 + 12 bytes per parameter (K = 12: a float32
     master copy, exp_avg, exp_avg_sq). Compute the memory per rank at p = 64 for 7.5 B
     parameters, plain and with ZeRO-1.
"""
import copy
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

from dist_sgd.plumbing.check import check, max_diff
from dist_sgd.ddp.ddp import DistributedDataParallel
from dist_sgd.plumbing.launch import launch, lesson_parser
from dist_sgd.plumbing.rank import device, log, under_torchrun
from dist_sgd.sgd.sync import average_gradients
from dist_sgd.plumbing.timing import summarize, time_alternating
from dist_sgd.shard.zero import ShardedOptimizer
from dist_sgd.comm.counted import wire_bytes

LR, STEPS = 1e-3, 3


def make_model(width, depth):
    """depth equal layers: whole-parameter shards balance when p divides depth."""
    torch.manual_seed(0)  # the same initial weights on every rank
    layers = [m for _ in range(depth) for m in (nn.Linear(width, width), nn.Tanh())]
    return nn.Sequential(*layers).to(device())  # NCCL: this rank's GPU


def train_step(model, opt, x, y, forward=None, before_step=None):
    opt.zero_grad()
    F.mse_loss((forward or model)(x), y).backward()
    if before_step:
        before_step()
    opt.step()


def held_bytes(model, opt):
    """Bytes this rank holds: parameters, gradients, optimizer state (tensors only)."""
    count = lambda ts: sum(t.numel() * t.element_size() for t in ts)  # noqa: E731
    state = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
    return {"params": count(model.parameters()),
            "grads": count(p.grad for p in model.parameters() if p.grad is not None),
            "state": count(state)}


def run(rank, world_size, args):
    width, depth, batch = args.width, args.depth, args.batch
    torch.manual_seed(100 + rank)  # every rank its own batch
    x, y = torch.randn(batch, width, device=device()), torch.randn(batch, width, device=device())
    # 1. Memory, bytes and time, in float32: plain data parallelism (average_gradients, then
    # the full Adam on every rank) against ZeRO-1 in both schemes (the optimizer averages).
    plain_model = make_model(width, depth)
    plain = torch.optim.Adam(plain_model.parameters(), lr=LR)
    train_step(plain_model, plain, x, y,
               before_step=lambda: average_gradients(plain_model, flat=True))
    steps = {"plain Adam": lambda: (average_gradients(plain_model, flat=True), plain.step())}
    out = {"plain": held_bytes(plain_model, plain), "bytes": {}, "diffs": {}}
    n_bytes = out["plain"]["grads"]
    out["bytes"]["plain data parallel (all-reduce)"] = wire_bytes("all_reduce", n_bytes, world_size)
    for scheme in ("broadcast", "all_gather"):
        model = make_model(width, depth)
        opt = ShardedOptimizer(model.parameters(), torch.optim.Adam, scheme=scheme, lr=LR)
        train_step(model, opt, x, y)
        out["zero"] = held_bytes(model, opt)  # the same partition, the same bytes, either scheme
        out["bytes"][f"ZeRO-1 {scheme}"] = opt.bytes_per_step()  # counted from its collectives
        steps[f"ZeRO-1 {scheme}"] = opt.step
    # Gradients averaged by DDP: its all-reduce, then only the all-gather of the parameters.
    shared = sum(wire_bytes(c, n, world_size) for c, n in opt.comm_log if c == "all_gather")
    out["bytes"]["our DDP + ZeRO-1 all_gather"] = shared + wire_bytes("all_reduce", n_bytes,
                                                                      world_size)
    # Time per step, alternated (A B C A B C ...), medians over ranks' slowest: the gradients
    # are there already, so this is the communication and the update only.
    samples = time_alternating(steps, repeats=3 if args.quick else 15)
    out["ms"] = {k: 1e3 * summarize(v)["median"] for k, v in samples.items()}

    # 2. Equal to plain Adam, in float64 so that "equal" means rounding only (the sums of the
    # all-reduce and of the reduce-scatter add the ranks' numbers in different orders).
    ref = make_model(width, depth).double()
    ref_opt = torch.optim.Adam(ref.parameters(), lr=LR)
    ways = {"broadcast, torch's collectives": ("broadcast", "torch", False),
            "all_gather, our collectives": ("all_gather", "ours", False),
            "all_gather, under our DDP": ("all_gather", "torch", True)}
    models = {name: make_model(width, depth).double() for name in ways}
    opts = {name: ShardedOptimizer(models[name].parameters(), torch.optim.Adam, scheme=scheme,
                                   collectives=colls, reduce_gradients=not ddp, lr=LR)
            for name, (scheme, colls, ddp) in ways.items()}
    ddp = DistributedDataParallel(models["all_gather, under our DDP"])  # averages in backward
    x, y = x.double(), y.double()
    for _ in range(STEPS):
        train_step(ref, ref_opt, x, y, before_step=lambda: average_gradients(ref))
        for name in ways:
            train_step(models[name], opts[name], x, y, forward=ddp if "DDP" in name else None)
    out["diffs"] = {name: max_diff(models[name], ref) for name in ways}
    ddp.remove_hooks()
    torch.distributed.barrier()  # our DDP's last reduction done on every rank before teardown
    return out


def report(world_size, results):
    kib = 1024
    log(f"\n=== world size {world_size} ===")
    log(f"{'rank':>4} | {'params':>9} | {'grads':>9} | {'Adam state':>10} | {'total':>9} | "
        f"{'formula 4+4+8/p':>15} | plain data parallel   (KiB)")
    for rank, r in enumerate(results):
        n = r["plain"]["params"] / 4  # float32 parameters
        z, p = r["zero"], r["plain"]
        log(f"{rank:>4} | {z['params'] / kib:9.1f} | {z['grads'] / kib:9.1f} | "
            f"{z['state'] / kib:10.1f} | {sum(z.values()) / kib:9.1f} | "
            f"{n * (8 + 8 / world_size) / kib:15.1f} | {sum(p.values()) / kib:9.1f}")
    log("(Adam also keeps one 4-byte step counter per parameter tensor: the few bytes over "
        "the formula)")
    states = [r["zero"]["state"] for r in results]
    if max(states) > min(states):
        log(f"unequal shards: whole layers do not split evenly over {world_size} ranks (largest "
            f"shard {max(states) / min(states):.2f}x the smallest); the all_gather scheme pads "
            "every shard to the largest, so it sends more than 1.00x")
    plain_bytes = results[0]["bytes"]["plain data parallel (all-reduce)"]
    log("bytes each rank sends per step (counted), and per plain data parallel byte:")
    for name, b in results[0]["bytes"].items():
        ratio = f"{b / plain_bytes:.2f}x" if plain_bytes else "-"
        log(f"  {name:34s} {b / kib:10.1f} KiB  {ratio}")
    log("time per step (all-reduce/reduce-scatter + Adam + sharing), median, this machine:")
    for name, ms in results[0]["ms"].items():
        log(f"  {name:34s} {ms:8.2f} ms")
    for name in results[0]["diffs"]:
        diff = max(r["diffs"][name] for r in results)
        log(check(f"weights after {STEPS} steps, ZeRO-1 ({name}) vs plain Adam", diff, 1e-9))


def main():
    args = lesson_parser(__doc__, world_size=[1, 2, 3, 4]).parse_args()  # one after another
    args.width, args.depth, args.batch = (64, 8, 16) if args.quick else (512, 12, 64)
    if under_torchrun():
        args.world_size = [int(os.environ["WORLD_SIZE"])]  # torchrun made the group already
    log(f"model: {args.depth} x Linear({args.width}, {args.width}) = "
        f"{args.depth * (args.width + 1) * args.width:,} float32 parameters; Adam (lr {LR}); "
        f"per-rank batch {args.batch}")
    for ws in args.world_size:
        results = launch(run, ws, args, backend=args.backend)
        if results is not None:
            report(ws, results)
    log("\nOn this machine the ranks share 2 cores: more ranks are not faster, and the time "
        "column mostly shows communication and waiting. The memory columns hold anywhere.")
    log("\n" + __doc__[__doc__.index("Exercises:"):].rstrip())


if __name__ == "__main__":
    main()
