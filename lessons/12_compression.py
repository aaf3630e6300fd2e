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
  6. checks: our hooks against torch's on the same gradients, step for step.

Run:
    python lessons/12_compression.py                  # 2 ranks, 2 epochs x 8 runs (long: ~1 h on 2 busy cores)
    python lessons/12_compression.py --quick          # tiny sizes (~20 s)
    torchrun --standalone --nproc-per-node 2 lessons/12_compression.py --quick
    python -m dist_sgd.bench compress                 # figures/compress.png and its CSV

Exercises:
  1. Set START = 0 with use_error_feedback=False and warm_start=False. What does accuracy do?
  2. Why can P be summed over ranks but not orthogonalized before? (Hint: orthogonalization
     is not linear.)
  3. With the printed cost model, find the link speed below which PowerSGD rank 2 makes
     BigNet's step faster, for the compute time measured here.
"""
import torch
import torch.distributed.algorithms.ddp_comm_hooks.default_hooks as torch_default
import torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook as torch_powersgd
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as TorchDDP
from torch.utils.data import Subset

from dist_sgd import compress
from dist_sgd.check import check, max_diff
from dist_sgd.costmodel import human_bytes, link
from dist_sgd.data import get_dataset
from dist_sgd.launch import launch, lesson_parser, log
from dist_sgd.models import BigNet, Net, init_weights
from dist_sgd.timing import summarize, time_alternating
from dist_sgd.train import evaluate, shard_loader

SCHEMES = {"none": 0, "fp16": 0, "PowerSGD rank 1": 1, "PowerSGD rank 2": 2, "PowerSGD rank 4": 4}
BATCH = 64  # global batch


def make(scheme, start, error_feedback=True):
    """Net in torch's DDP with our hook for `scheme`, and the hook's state (None for plain)."""
    torch.manual_seed(0)
    model = TorchDDP(Net().apply(init_weights), bucket_cap_mb=1000)  # one bucket (torch quirk)
    rank = SCHEMES[scheme]  # PowerSGDState(process group, rank, start_powerSGD_iter, ...)
    state = compress.PowerSGDState(None, rank, start, use_error_feedback=error_feedback) if rank else None
    hook = (compress.powerSGD_hook if rank else
            compress.fp16_compress_hook if scheme == "fp16" else compress.allreduce_hook)
    counter = {"bytes": 0, "steps": 0}

    def counted(s, bucket):  # the bytes this step's all-reduces get, as the hook sends them
        if state is None:
            counter["bytes"] += bucket.buffer().numel() * (2 if scheme == "fp16" else 4)
        counter["steps"] += bucket.is_last()
        return hook(s, bucket)

    model.register_comm_hook(state, counted)
    return model, state, counter


def train(model, state, train_set, epochs, residual):
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.5)
    loader = shard_loader(train_set, BATCH)
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            F.nll_loss(model(x), y).backward()  # the hook runs in here, bucket by bucket
            if residual is not None and state.error_dict:  # ||e|| vs the averaged gradient
                residual.append((torch.cat(list(state.error_dict.values())).norm().item(),
                                 torch.cat([p.grad.flatten() for p in model.parameters()]).norm().item()))
            opt.step()


def same_gradients_check(train_set):
    """Our hooks and torch's on the same gradients (plain tensors in a FlatBucket), 5 steps."""
    model, diffs = Net().apply(init_weights), {"fp16": 0.0, "powerSGD": 0.0}
    pairs = {"fp16": ((None, compress.fp16_compress_hook), (None, torch_default.fp16_compress_hook)),
             "powerSGD": ((compress.PowerSGDState(None, 2, 2), compress.powerSGD_hook),
                          (torch_powersgd.PowerSGDState(None, 2, 2), torch_powersgd.powerSGD_hook))}
    for step, (x, y) in zip(range(5), shard_loader(train_set, BATCH)):
        model.zero_grad()
        F.nll_loss(model(x), y).backward()
        grads = [p.grad for p in model.parameters()]
        for name, ((s1, ours), (s2, theirs)) in pairs.items():
            a = ours(s1, compress.FlatBucket(grads)).wait()
            b = theirs(s2, compress.FlatBucket(grads)).wait()
            diffs[name] = max(diffs[name], max_diff(a, b))
    return diffs


def main(rank, world_size, quick):
    start = 2 if quick else 20  # plain all-reduce steps before PowerSGD starts (torch: ~10%)
    train_set, test_set = get_dataset("auto", quiet=rank > 0), get_dataset("auto", False, quiet=True)
    if quick:
        train_set, test_set = Subset(train_set, range(256)), Subset(test_set, range(200))
    out = {"checks": same_gradients_check(train_set), "runs": {}, "residual": [],
           "world_size": world_size, "start": start}
    runs = [(s, True) for s in SCHEMES] + [(s, False) for s in SCHEMES if SCHEMES[s]]
    models = {}
    for scheme, ef in runs:
        model, state, counter = make(scheme, start, ef)
        residual = out["residual"] if (scheme, ef) == ("PowerSGD rank 1", True) else None
        train(model, state, train_set, 2, residual)
        sent = (counter["bytes"] / counter["steps"] if state is None else  # PowerSGD: its own count
                4 * state.compression_stats()[2] / max(counter["steps"] - start, 1))
        out["runs"][scheme, ef] = {"accuracy": evaluate(model, test_set)["accuracy"], "bytes": sent}
        models.update({scheme: model} if ef else {})
    # Step time over loopback, every scheme alternated (A B C A B C ...), medians.
    x, y = next(iter(shard_loader(train_set, BATCH)))
    steps = {s: (lambda m=m: F.nll_loss(m(x), y).backward()) for s, m in models.items()}
    times = time_alternating(steps, repeats=3 if quick else 20, warmup=1)
    out["step_ms"] = {s: 1e3 * summarize(t)["median"] for s, t in times.items()}
    big, xb = BigNet(), torch.randn(8 if quick else 32, 1, 28, 28)  # BigNet's compute alone
    one = time_alternating({"bignet": lambda: big(xb).sum().backward()}, 3 if quick else 10, 1)
    return dict(out, bignet_compute_s=summarize(one["bignet"])["median"], bignet_batch=len(xb))


def report(r):
    log(f"\n--- 1. bytes each rank hands to all-reduce per step (Net, {r['world_size']} ranks) ---")
    net, big = [[p.shape for p in m().parameters()] for m in (Net, BigNet)]
    plain = r["runs"]["none", True]["bytes"]
    for scheme, k in SCHEMES.items():
        counted = r["runs"][scheme, True]["bytes"]
        net_b, big_b = [sum(v * w for v, w in compress.values_sent(shapes, "powerSGD" if k else scheme, k or 1))
                        for shapes in (net, big)]
        log(f"  {scheme:16s} Net {human_bytes(counted):>9s} ({plain / counted:5.1f}x fewer)   "
            f"BigNet, on paper: {human_bytes(big_b):>9s}")
        log(check(f"{scheme}: bytes counted vs on paper", abs(counted - net_b), 0))
    log("  (a ring all-reduce puts 2(p-1)/p of these bytes on each rank's link, each way)")

    log("\n--- 2. error feedback: what PowerSGD rank 1 dropped, carried to the next step ---")
    res = r["residual"]
    for i, (e, g) in ((i, res[i]) for i in sorted({0, len(res) // 4, len(res) // 2, len(res) - 1})):
        log(f"  compressed step {i + 1:5d}: ||e|| = {e:.4f}   ||averaged gradient|| = {g:.4f}   ratio {e / g:.2f}")
    log("  (e is this rank's backlog: what the low-rank P Q^T has not sent yet. Added to the next\n"
        "   gradient, its largest directions get sent then, and new leftovers take their place)")

    log("\n--- 3. test accuracy after 2 epochs (PowerSGD from step "
        f"{r['start'] + 1}; same seed, same batches) ---")
    for (scheme, ef), run in r["runs"].items():
        label = scheme + ("" if not SCHEMES[scheme] else ", error feedback" if ef else ", no error feedback")
        log(f"  {label:40s} {100 * run['accuracy']:6.2f}%")

    log("\n--- 4. step time over loopback (forward + backward + hook, alternated, medians) ---")
    for scheme, ms in r["step_ms"].items():
        log(f"  {scheme:16s} {ms:7.2f} ms   ({ms / r['step_ms']['none']:.2f}x none)")
    log("  (loopback moves GB/s, so bytes are cheap here: what PowerSGD saves it can lose to its\n"
        "   arithmetic and to three all-reduces where there was one; slow links are another story, below)")

    compute, world_size = r["bignet_compute_s"], r["world_size"]
    log(f"\n--- 5. the cost model with compression: BigNet, {world_size} workers, ring, no overlap,"
        f"\n    compute {compute * 1e3:.1f} ms ({r['bignet_batch']} samples, measured here; "
        "compression arithmetic not counted) ---")
    for gbit, lat in ((1, 50), (10, 25)):
        alpha, beta = link(gbit, lat)
        cells = [f"{s} {1e3 * compress.predict_compressed_step(compute, big, world_size, 'powerSGD' if k else s, alpha, beta, k or 1):.1f} ms"
                 for s, k in SCHEMES.items()]
        log(f"  {gbit:2d} Gbit/s: " + ", ".join(cells))

    log("\n--- 6. the 2-node 1 Gbit/s link: skipped: it needs lesson 11's cluster (dist_sgd.cluster) ---")

    log("\n--- checks: our hooks vs torch's, the same gradients ---")
    log(check("fp16_compress_hook (ours vs torch's, bit for bit)", r["checks"]["fp16"], 0))
    log(check("powerSGD_hook rank 2, 5 steps (ours vs torch's)", r["checks"]["powerSGD"], 1e-6))


if __name__ == "__main__":
    args = lesson_parser(__doc__, world_size=2).parse_args()
    log(__doc__.split("\n\n")[0])
    results = launch(main, args.world_size, args.quick, backend=args.backend or "gloo")
    if results is not None:
        report(results[0])
