"""Lesson 12: gradient compression - send fewer bytes per step (fp16, PowerSGD, error feedback).

When the network is the bottleneck, the next move is to send fewer bytes. DDP lets you
replace its "average this bucket" by any function of yours, a communication hook:

    ddp_model.register_comm_hook(state, hook)     # hook(state, bucket) -> Future(averaged flat grads)

dist_sgd/compress.py writes out three hooks, each proven equal to torch's own
(tests/test_compress.py, on torch's DDP):
  - allreduce_hook: divide by the world size, all-reduce. What DDP does anyway: 4 B per value.
  - fp16_compress_hook: the same in float16: 2 B per value, ~3 significant digits.
  - powerSGD_hook (Vogels et al. 2019): each gradient matrix M (n x m) goes as two thin ones,
    P = M Q (n x r) and Q = M^T P (m x r), after one step of power iteration; every rank
    rebuilds M ~ P Q^T. (n + m) r values instead of n m: Net's fc1 (50 x 320) at rank 1 sends
    370 values instead of 16,000. Biases (1-D) go uncompressed. What the approximation drops
    stays on the rank (error feedback) and is added to the next step's gradient: delayed, not
    lost. Warm start begins each power iteration from last step's Q, so the approximation
    keeps improving across steps.

This lesson, on 2 ranks by default (torch's DDP with our hooks):
  1. bytes each rank hands to all-reduce per step, counted by the hooks, for none / fp16 /
     PowerSGD rank 1, 2, 4 (Net trained here, BigNet on paper);
  2. the error-feedback residual ||e|| over steps, against the gradient it rides along with;
  3. test accuracy on Fashion-MNIST after 2 epochs for each, PowerSGD with and without error
     feedback (PowerSGD starts after START plain steps, as torch advises);
  4. step time over loopback, where bytes cost little: compression costs arithmetic and,
     for PowerSGD, three all-reduces (vectors, P, Q) where there was one;
  5. the cost model (lesson 10) with compression: predicted step times on 1 and 10 Gbit/s;
  6. checks: our hooks against torch's on the same gradients, step for step;
  7. step time where bytes do cost: BigNet on 2 nodes of lesson 11's cluster, each behind a
     1 Gbit/s link, torch's DDP as it comes (no hook; its buckets overlap backward) against our
     DDP + our PowerSGD rank 2 (one bucket), alternated, medians. The lesson re-runs itself
     once in each node (a hidden --in-node flag, as lesson 11). Needs root (network
     namespaces); without it it prints why and skips; --quick always skips it (the cluster
     adds ~10-20 s). Honest expectation: the link makes BigNet's 4.6 MiB cost ~40 ms, PowerSGD
     sends 78 KiB instead, but both nodes compute on this machine's shared cores, and
     PowerSGD adds its own arithmetic, so the step gets faster by much less than the bytes shrink.

Run:
    python lessons/12_compression.py                  # 2 ranks, 2 epochs x 8 runs (~2.5 min on 2 cores); part 7 needs root
    python lessons/12_compression.py --quick          # tiny sizes (~20 s)
    torchrun --standalone --nproc-per-node 2 lessons/12_compression.py --quick
    # figures/compress.png and its CSV: the figures' benchmark (README), `compress` measurement

Exercises:
  1. Set START = 0 with use_error_feedback=False and warm_start=False. What does accuracy do?
  2. Why can P be summed over ranks but not orthogonalized before? (Hint: orthogonalization
     is not linear.)
  3. With the printed cost model, find the link speed below which PowerSGD rank 2 makes
     BigNet's step faster, for the compute time measured here.
"""
import argparse

import torch
import torch.distributed as dist
import torch.distributed.algorithms.ddp_comm_hooks.default_hooks as torch_default
import torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook as torch_powersgd
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as TorchDDP
from torch.utils.data import Subset

from dist_sgd.scale import cluster
from dist_sgd.ddp import compress
from dist_sgd.plumbing.check import check, max_diff
from dist_sgd.scale.costmodel import human_bytes, link
from dist_sgd.sgd.data import get_dataset
from dist_sgd.ddp.ddp import DistributedDataParallel
from dist_sgd.plumbing.launch import launch, lesson_parser
from dist_sgd.plumbing.rank import log
from dist_sgd.sgd.models import BigNet, Net, init_weights
from dist_sgd.plumbing.timing import summarize, time_alternating
from dist_sgd.sgd.train import evaluate, shard_loader

SCHEMES = {"none": 0, "fp16": 0, "PowerSGD rank 1": 1, "PowerSGD rank 2": 2, "PowerSGD rank 4": 4}
BATCH = 64  # global batch
LINK = "BigNet on 2 nodes, each behind a 1 Gbit/s link (lesson 11's cluster)"


def make(scheme, start, error_feedback=True):  # Net in torch's DDP with our hook; the hook's state
    torch.manual_seed(0)
    model = TorchDDP(Net().apply(init_weights), bucket_cap_mb=1000)  # one bucket (torch quirk)
    # PowerSGDState(process group, matrix_approximation_rank, start_powerSGD_iter, ...)
    state = compress.PowerSGDState(None, SCHEMES[scheme], start, use_error_feedback=error_feedback) if SCHEMES[scheme] else None
    hook = compress.powerSGD_hook if state else compress.fp16_compress_hook if scheme == "fp16" else compress.allreduce_hook
    counter = {"bytes": 0, "steps": 0}  # the hook counts steps, and the bytes it hands to all-reduce
    model.register_comm_hook(state, compress.counted(hook, counter, 2 if scheme == "fp16" else 4))
    return model, state, counter


def train(model, state, train_set, epochs, residual):
    opt, loader = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.5), shard_loader(train_set, BATCH)
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            F.nll_loss(model(x), y).backward()  # the hook runs in here, bucket by bucket
            if residual is not None and state.error_dict:  # ||e|| vs the averaged gradient
                residual.append((torch.cat(list(state.error_dict.values())).norm().item(),
                                 torch.cat([p.grad.flatten() for p in model.parameters()]).norm().item()))
            opt.step()


def same_gradients_check(train_set):  # our hooks and torch's on the same gradients (in a FlatBucket), 5 steps
    model, diffs = Net().apply(init_weights), {"fp16": 0.0, "powerSGD": 0.0}
    pairs = {"fp16": ((None, compress.fp16_compress_hook), (None, torch_default.fp16_compress_hook)),
             "powerSGD": ((compress.PowerSGDState(None, 2, 2), compress.powerSGD_hook),
                          (torch_powersgd.PowerSGDState(None, 2, 2), torch_powersgd.powerSGD_hook))}
    for step, (x, y) in zip(range(5), shard_loader(train_set, BATCH)):
        model.zero_grad()
        F.nll_loss(model(x), y).backward()
        grads = [p.grad for p in model.parameters()]
        for name, ((s1, ours), (s2, theirs)) in pairs.items():
            a, b = ours(s1, compress.FlatBucket(grads)).wait(), theirs(s2, compress.FlatBucket(grads)).wait()
            diffs[name] = max(diffs[name], max_diff(a, b))
    return diffs


def step_times(models, x, y, repeats):  # median s of forward + backward (+ hook), alternated A B C A B C
    steps = {s: (lambda m=m: F.nll_loss(m(x), y).backward()) for s, m in models.items()}
    return {s: summarize(t)["median"] for s, t in time_alternating(steps, repeats, warmup=2).items()}


def main(rank, world_size, quick):
    log(__doc__.split("\n\n")[0])  # rank 0 only
    start = 2 if quick else 20  # plain all-reduce steps before PowerSGD starts (torch: ~10%)
    train_set, test_set = get_dataset("auto", quiet=rank > 0), get_dataset("auto", False, quiet=True)
    if quick:
        train_set, test_set = Subset(train_set, range(256)), Subset(test_set, range(200))
    out = {"checks": same_gradients_check(train_set), "runs": {}, "residual": [], "world_size": world_size, "start": start}
    models = {}
    for scheme, ef in [(s, True) for s in SCHEMES] + [(s, False) for s in SCHEMES if SCHEMES[s]]:
        model, state, counter = make(scheme, start, ef)
        residual = out["residual"] if (scheme, ef) == ("PowerSGD rank 1", True) else None
        train(model, state, train_set, 2, residual)
        sent = (counter["bytes"] / counter["steps"] if state is None else  # PowerSGD: its own count
                4 * state.compression_stats()[2] / max(counter["steps"] - start, 1))
        out["runs"][scheme, ef] = {"accuracy": evaluate(model, test_set)["accuracy"], "bytes": sent}
        models.update({scheme: model} if ef else {})
    out["step_s"] = step_times(models, *next(iter(shard_loader(train_set, BATCH))), 3 if quick else 20)
    xb, yb = torch.randn(8 if quick else 32, 1, 28, 28), torch.zeros(8 if quick else 32, dtype=torch.long)
    return dict(out, bignet_compute_s=step_times({"BigNet": BigNet()}, xb, yb, 3 if quick else 10)["BigNet"], bignet_batch=len(xb))


def report(r):
    log(f"\n--- 1. bytes each rank hands to all-reduce per step (Net, {r['world_size']} ranks) ---")
    net, big = [[p.shape for p in m().parameters()] for m in (Net, BigNet)]
    for scheme, k in SCHEMES.items():
        counted = r["runs"][scheme, True]["bytes"]
        net_b, big_b = [sum(v * w for v, w in compress.values_sent(shapes, "powerSGD" if k else scheme, k or 1))
                        for shapes in (net, big)]
        log(f"  {scheme:16s} Net {human_bytes(counted):>9s} ({r['runs']['none', True]['bytes'] / counted:5.1f}x fewer)   "
            f"BigNet, on paper: {human_bytes(big_b):>9s}")
        log(check(f"{scheme}: bytes counted vs on paper", abs(counted - net_b), 0))
    log("  (a ring all-reduce puts 2(p-1)/p of these bytes on each rank's link, each way)")

    log("\n--- 2. error feedback: what PowerSGD rank 1 dropped, carried to the next step ---")
    res = r["residual"]
    for i, (e, g) in ((i, res[i]) for i in sorted({0, len(res) // 4, len(res) // 2, len(res) - 1})):
        log(f"  compressed step {i + 1:5d}: ||e|| = {e:.4f}   ||averaged gradient|| = {g:.4f}   ratio {e / g:.2f}")
    log("  (e: this rank's backlog, what P Q^T has not sent yet; added to the next gradient, it goes out later)")

    log("\n--- 3. test accuracy after 2 epochs (PowerSGD from step "
        f"{r['start'] + 1}; same seed, same batches) ---")
    for (scheme, ef), run in r["runs"].items():
        label = scheme + ("" if not SCHEMES[scheme] else ", error feedback" if ef else ", no error feedback")
        log(f"  {label:40s} {100 * run['accuracy']:6.2f}%")

    log("\n--- 4. step time over loopback (forward + backward + hook, alternated, medians) ---")
    for scheme, s in r["step_s"].items():
        log(f"  {scheme:16s} {s * 1e3:7.2f} ms   ({s / r['step_s']['none']:.2f}x none)")
    log("  (bytes are cheap over loopback: PowerSGD can lose more to arithmetic and 3 all-reduces than it saves)")

    compute, world_size = r["bignet_compute_s"], r["world_size"]
    log(f"\n--- 5. the cost model with compression: BigNet, {world_size} workers, ring, no overlap, compute"
        f" {compute * 1e3:.1f} ms\n    ({r['bignet_batch']} samples, measured here; compression arithmetic not counted) ---")
    for gbit, lat in ((1, 50), (10, 25)):
        alpha, beta = link(gbit, lat)
        cells = [f"{s} {1e3 * compress.predict_compressed_step(compute, big, world_size, 'powerSGD' if k else s, alpha, beta, k or 1):.1f} ms"
                 for s, k in SCHEMES.items()]
        log(f"  {gbit:2d} Gbit/s: " + ", ".join(cells))

    log("\n--- 6. checks: our hooks vs torch's, the same gradients ---")
    log(check("fp16_compress_hook (ours vs torch's, bit for bit)", r["checks"]["fp16"], 0))
    log(check("powerSGD_hook rank 2, 5 steps (ours vs torch's)", r["checks"]["powerSGD"], 1e-6))


def on_the_link(rank, world_size, quick):  # 7. one rank per node: BigNet, torch's DDP vs our DDP + our PowerSGD
    log(f"\n--- 7. {LINK}, 16 samples per node, alternated, medians ---")
    ours = DistributedDataParallel(BigNet(), bucket_cap_mb=None)  # one bucket (torch quirk, above)
    ours.register_comm_hook(compress.PowerSGDState(None, 2, start_powerSGD_iter=2), compress.powerSGD_hook)
    models = {"torch DDP, no compression": TorchDDP(BigNet()), "our DDP + our PowerSGD rank 2": ours}
    t = step_times(models, torch.randn(16, 1, 28, 28), torch.randint(0, 10, (16,)), 3 if quick else 15)
    dist.barrier()  # torch's reducer finishes before anyone leaves the group
    log("\n".join(f"  {name:30s} {s * 1e3:7.1f} ms" for name, s in t.items()))
    log(f"  PowerSGD rank 2 / no compression: {t['our DDP + our PowerSGD rank 2'] / t['torch DDP, no compression']:.2f}x")


if __name__ == "__main__":
    parser = lesson_parser(__doc__, world_size=2)
    parser.add_argument("--in-node", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.in_node:  # one rank in each node of the cluster below (part 7): measure; node 0 prints
        launch(on_the_link, None, args.quick, backend="gloo")
    elif (results := launch(main, args.world_size, args.quick, backend=args.backend or "gloo")) is not None:
        report(results[0])
        # Part 7: a 2-node cluster whose every node runs this file with --in-node (on_the_link).
        why = "--quick leaves it out (~10 s more)" if args.quick else cluster.run_in_nodes([__file__, "--in-node"])
        if why:
            log(f"\n--- 7. {LINK}: skipped: {why}")
