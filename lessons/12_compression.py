"""Lesson 12: gradient compression - send fewer bytes per step (fp16, PowerSGD, error feedback).

When the network is the bottleneck, the next move is to send fewer bytes. DDP lets you
replace its "average this bucket" by any function of yours, a communication hook:

    ddp_model.register_comm_hook(state, hook)   # hook(state, bucket) -> Future(averaged flat grads)

dist_sgd/ddp/compress.py writes out three hooks, each proven equal to torch's own
(tests/test_compress.py):
  - allreduce_hook: divide by the world size, all-reduce. What DDP does anyway: 4 B per value.
  - fp16_compress_hook: the same in float16: 2 B per value, ~3 significant digits.
  - powerSGD_hook (Vogels et al. 2019): each gradient matrix M (n x m) goes as two thin ones,
    P = M Q (n x r) and Q = M^T P (m x r), after one step of power iteration; every rank
    rebuilds M ~ P Q^T. (n + m) r values instead of n m: Net's fc1 (50 x 320) at rank 1 sends
    370 values instead of 16,000. Biases (1-D) go uncompressed. What the approximation drops
    stays on the rank (error feedback) and is added to the next step's gradient: delayed, not
    lost. Warm start begins each power iteration from last step's Q.
PowerSGD needs three all-reduces per bucket (vectors, P's, Q's), the Q's only once the P's are
summed, so from a callback: with several buckets, every rank must still issue them in one order
(dist_sgd/comm/ordered.py: in_order), or gloo pairs one bucket's message with another's.

This lesson, on 2 ranks (our DDP, Net's gradients in 3 buckets, our hooks):
  1. bytes each rank hands to all-reduce per step, counted by the hooks, for none / fp16 /
     PowerSGD rank 1, 2, 4 (Net trained here, BigNet on paper);
  2. the error-feedback residual ||e|| over steps, against the gradient it rides along with;
  3. test accuracy on Fashion-MNIST after 2 epochs for each, PowerSGD with and without error
     feedback (PowerSGD starts after `start` plain steps, as torch advises);
  4. the cost model (lesson 10) with compression: predicted step times on 1 and 10 Gbit/s;
  5. checks: our hooks against torch's on the same gradients, step for step;
  6. step time where bytes do cost: BigNet on 2 nodes of lesson 11's cluster, each behind a
     1 Gbit/s link, measured by `sudo python3 -m dist_sgd.bench compress` (root: network
     namespaces); this lesson prints the numbers committed in figures/compress.csv. Honest
     expectation: the link makes BigNet's 4.6 MiB cost ~40 ms and PowerSGD sends 78 KiB
     instead, but both nodes compute on this machine's shared cores, and PowerSGD's own passes
     over the gradients cost CPU: the step gets faster by much less than the bytes shrink.
Step times over loopback, where bytes cost little, are the same benchmark's (figures/compress.png).

Run:
    python lessons/12_compression.py            # 2 ranks, 2 epochs x 8 runs (~2.5 min on 2 cores)
    python lessons/12_compression.py --quick    # tiny sizes (~20 s)
    torchrun --standalone --nproc-per-node 2 lessons/12_compression.py --quick

Exercises:
  0. Write the hooks yourself: `python3 -m dist_sgd.course start fp16_compress_hook` (then
     `... check fp16_compress_hook`: torch's fp16 hook bit for bit, float16 on the wire) and
     `python3 -m dist_sgd.course start powerSGD_hook` (P = M Q, orthogonalize, Q = M^T P, the
     residual kept: torch's powerSGD_hook step for step), both graded on torch's DDP at world
     sizes 1-3; `DIST_SGD_MINE=mine python3 lessons/12_compression.py` runs this lesson on them.
  1. Set start = 0 with use_error_feedback=False and warm_start=False. What does accuracy do?
  2. Why can P be summed over ranks but not orthogonalized before? (Hint: orthogonalization
     is not linear.)
  3. With the printed cost model, find the link speed below which PowerSGD rank 2 makes
     BigNet's step faster, for the compute time measured here.
"""
import time

import torch
import torch.distributed.algorithms.ddp_comm_hooks.default_hooks as torch_default
import torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook as torch_powersgd
import torch.nn.functional as F
from torch.utils.data import Subset

from dist_sgd.ddp import compress
from dist_sgd.ddp.ddp import DistributedDataParallel
from dist_sgd.ddp.grad_bucket import GradBucket
from dist_sgd.plumbing.check import check, max_diff
from dist_sgd.plumbing.figures import read_csv
from dist_sgd.scale.summaries import COMPRESS_LINK, compress_link, compress_link_lines
from dist_sgd.plumbing.launch import launch, lesson_parser
from dist_sgd.plumbing.rank import device, log
from dist_sgd.scale.costmodel import human_bytes, link, predict_compressed_step
from dist_sgd.sgd.data import get_dataset
from dist_sgd.sgd.models import BigNet, Net, init_weights
from dist_sgd.sgd.train import evaluate, shard_loader

SCHEMES = {"none": 0, "fp16": 0, "PowerSGD rank 1": 1, "PowerSGD rank 2": 2, "PowerSGD rank 4": 4}
BATCH, BUCKET_MB = 64, 0.01  # global batch; 0.01 MiB: Net's 87 KB of gradients in 3 buckets


def make(scheme, start, error_feedback):  # Net in our DDP with our hook, counting what it sends
    torch.manual_seed(0)
    model = DistributedDataParallel(Net().apply(init_weights).to(device()), BUCKET_MB)
    k = SCHEMES[scheme]
    # PowerSGDState(process group, matrix_approximation_rank, start_powerSGD_iter, ...)
    state = compress.PowerSGDState(None, k, start, use_error_feedback=error_feedback) if k else None
    hook = compress.powerSGD_hook if k else \
        compress.fp16_compress_hook if scheme == "fp16" else compress.allreduce_hook
    counter = {"bytes": 0, "steps": 0}  # the hook counts steps and the bytes it sends
    model.register_comm_hook(state, compress.counted(hook, counter, 2 if scheme == "fp16" else 4))
    return model, state, counter


def train(model, state, train_set, residual):  # 2 epochs; ||e|| vs ||averaged gradient||
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.5)
    loader = shard_loader(train_set, BATCH)
    for epoch in range(2):
        loader.sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            # the hook runs in here, bucket by bucket
            F.nll_loss(model(x.to(device())), y.to(device())).backward()
            if residual is not None and state.error_dict:
                grad = torch.cat([p.grad.flatten() for p in model.parameters()])
                e = torch.cat(list(state.error_dict.values()))
                residual.append((e.norm().item(), grad.norm().item()))
            opt.step()


def same_gradients(train_set):  # our hooks and torch's on the same gradients, 5 steps
    model, diffs = Net().apply(init_weights).to(device()), {"fp16": 0.0, "powerSGD": 0.0}
    # torch's powerSGD_hook calls torch.cuda.synchronize(bucket's device) wherever a GPU
    # exists, which fails on CPU gradients (gloo on a GPU machine): give it theirs on the GPU.
    there = torch.device("cuda") if torch.cuda.is_available() else device()
    pairs = {"fp16": ((None, compress.fp16_compress_hook),
                      (None, torch_default.fp16_compress_hook)),
             "powerSGD": ((compress.PowerSGDState(None, 2, 2), compress.powerSGD_hook),
                          (torch_powersgd.PowerSGDState(None, 2, 2), torch_powersgd.powerSGD_hook))}
    for step, (x, y) in zip(range(5), shard_loader(train_set, BATCH)):
        model.zero_grad()
        F.nll_loss(model(x.to(device())), y.to(device())).backward()
        grads = [p.grad for p in model.parameters()]
        for name, ((s1, ours), (s2, theirs)) in pairs.items():
            a = ours(s1, GradBucket.of(grads)).wait()
            b = theirs(s2, GradBucket.of([g.to(there) for g in grads])).wait()
            diffs[name] = max(diffs[name], max_diff(a, b))
    return diffs


def run(rank, world_size, args):
    start = 2 if args.quick else 20  # plain all-reduce steps before PowerSGD starts (torch: ~10%)
    train_set = get_dataset("auto", quiet=rank > 0)
    test_set = get_dataset("auto", train=False, quiet=True)
    if args.quick:
        train_set, test_set = Subset(train_set, range(256)), Subset(test_set, range(200))
    out = {"checks": same_gradients(train_set), "runs": {}, "residual": [], "start": start}
    for scheme, ef in [(s, True) for s in SCHEMES] + [(s, False) for s in SCHEMES if SCHEMES[s]]:
        model, state, counter = make(scheme, start, ef)
        residual = out["residual"] if (scheme, ef) == ("PowerSGD rank 1", True) else None
        train(model, state, train_set, residual)
        sent = (counter["bytes"] / counter["steps"] if state is None else  # PowerSGD counts its own
                4 * state.compression_stats()[2] / max(counter["steps"] - start, 1))
        out["runs"][scheme, ef] = {"accuracy": evaluate(model, test_set)["accuracy"], "bytes": sent}
    big, xb = BigNet().to(device()), torch.randn(32, 1, 28, 28, device=device())
    yb = torch.zeros(32, dtype=torch.long, device=device())
    F.nll_loss(big(xb), yb).backward()  # warm-up; then 3 timed: the cost model's compute
    t = time.perf_counter()
    for _ in range(3):
        F.nll_loss(big(xb), yb).backward()
    torch.cuda.synchronize() if xb.is_cuda else None  # a GPU runs ahead of Python: wait for it
    return dict(out, world_size=world_size, compute_s=(time.perf_counter() - t) / 3)


def report(r):
    log(f"\n--- 1. bytes each rank hands to all-reduce per step (Net, {r['world_size']} ranks) ---")
    net, big = [[p.shape for p in m().parameters()] for m in (Net, BigNet)]
    for scheme, k in SCHEMES.items():
        counted, plain = r["runs"][scheme, True]["bytes"], r["runs"]["none", True]["bytes"]
        net_b, big_b = [sum(v * w for v, w in compress.values_sent(
            shapes, "powerSGD" if k else scheme, k or 1)) for shapes in (net, big)]
        log(f"  {scheme:16s} Net {human_bytes(counted):>9s} ({plain / counted:5.1f}x fewer)"
            f"   BigNet, on paper: {human_bytes(big_b):>9s}")
        log("    " + check(f"{scheme}: bytes counted vs on paper", abs(counted - net_b), 0))
    log("  (a ring all-reduce puts 2(p-1)/p of these bytes on each rank's link, each way)")

    log("\n--- 2. error feedback: what PowerSGD rank 1 dropped, carried to the next step ---")
    res = r["residual"]
    for i in sorted({0, len(res) // 4, len(res) // 2, len(res) - 1}):
        e, g = res[i]
        log(f"  compressed step {i + 1:5d}: ||e|| = {e:.4f}   ||averaged gradient|| = {g:.4f}"
            f"   ratio {e / g:.2f}")
    log("  (e: this rank's backlog, what P Q^T has not sent yet; added to the next gradient)")

    log(f"\n--- 3. test accuracy after 2 epochs (PowerSGD from step {r['start'] + 1}) ---")
    for (scheme, ef), run_ in r["runs"].items():
        label = scheme + ("" if not SCHEMES[scheme] else
                          ", error feedback" if ef else ", no error feedback")
        log(f"  {label:40s} {100 * run_['accuracy']:6.2f}%")

    compute, p = r["compute_s"], r["world_size"]
    log(f"\n--- 4. the cost model with compression: BigNet, {p} workers, ring, no overlap, "
        f"compute {compute * 1e3:.1f} ms (32 samples, here) ---")
    for gbit, latency_us in ((1, 50), (10, 25)):
        alpha, beta = link(gbit, latency_us)
        cells = [(s, predict_compressed_step(
                     compute, compress.values_sent(big, "powerSGD" if k else s, k or 1), p,
                     alpha, beta)) for s, k in SCHEMES.items()]
        log(f"  {gbit:2d} Gbit/s: " + ", ".join(f"{s} {1e3 * t:.1f} ms" for s, t in cells))

    log("\n--- 5. checks: our hooks vs torch's, the same gradients ---")
    log(check("fp16_compress_hook (ours vs torch's, bit for bit)", r["checks"]["fp16"], 0))
    log(check("powerSGD_hook rank 2, 5 steps (ours vs torch's)", r["checks"]["powerSGD"], 1e-6))

    log(f"\n--- 6. the {COMPRESS_LINK}, as committed in figures/compress.csv ---")
    try:
        link_rows = compress_link(read_csv("compress")[0])
    except OSError:  # a checkout without the figures
        link_rows = {}
    if link_rows:
        log("\n".join(compress_link_lines(link_rows)))
    log("  measure it (root: network namespaces): sudo python3 -m dist_sgd.bench compress")


if __name__ == "__main__":
    args = lesson_parser(__doc__).parse_args()
    results = launch(run, args.world_size, args, backend=args.backend)
    if results is not None:
        log(__doc__.split("\n\n")[0])
        report(results[0])
