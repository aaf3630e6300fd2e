"""On a GPU: our DistributedDataParallel and our collectives against torch's (needs CUDA).

    python3 -m dist_sgd.bench gpu --save-figures   # gpu.csv, gpu.png into figures/, naming the GPU

Two parts, each timed alternated (A B A B ...), medians, every step synchronized with the GPU
(dist_sgd.plumbing.timing waits for it before reading the clock):
  "ddp": one training step (forward, backward, SGD) of our DistributedDataParallel against
      torch's on one GPU (NCCL, world size 1: the all-reduce is trivial, so what differs is the
      machinery: our Python hooks and bucket copies against torch's C++ reducer), for lesson
      07's Net (batch 64) and an MLP of many small layers (16 x Linear(1024, 1024), batch 64),
      whose step is about a millisecond on a big GPU, where Python's cost per hook shows.
      The target: ours within 1.10x torch's.
  "all_reduce": our ring all-reduce against torch's (dist.all_reduce) on CUDA tensors of 4 KiB
      to 64 MiB, over NCCL at world size 1 and over gloo at world size 2 (two ranks sharing the
      GPU: both stage the tensor through host memory, ours in comm/wire, torch's in gloo).
Without a CUDA GPU it measures nothing: the part is skipped with that reason (and `python3 -m
dist_sgd.bench gpu` alone says so in one line and exits with code 2). Nothing of this has been
measured yet: figures/ holds no gpu.csv until someone runs it on a GPU.
"""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from dist_sgd.bench.common import Skip
from dist_sgd.plumbing.figures import read_csv, write_csv
from dist_sgd.plumbing.launch import launch
from dist_sgd.plumbing.timing import summarize, time_alternating

NAME = "gpu"
SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20]  # bytes


def no_gpu():
    """Why this cannot run here, or None when a CUDA GPU is present."""
    if not torch.cuda.is_available():
        return "no CUDA GPU here (torch.cuda.is_available() is False): nothing to measure"
    return None


def gpu_name():
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"


def _models(quick):
    from dist_sgd.sgd.models import Net
    width = 256 if quick else 1024  # --quick: small enough for a CPU (the tests run it there)
    mlp = lambda: nn.Sequential(*[m for _ in range(16)  # noqa: E731
                                  for m in (nn.Linear(width, width), nn.ReLU())],
                                nn.Linear(width, 10))
    return {"Net (lesson 07), batch 64": (Net, (64, 1, 28, 28)),
            f"MLP 16 x {width}, batch 64": (mlp, (64, width))}


def _ddp_worker(rank, world_size, quick):
    """Step time of our DDP and torch's on twin models, this rank's GPU."""
    from dist_sgd.ddp.ddp import DistributedDataParallel
    from dist_sgd.plumbing.rank import device
    dev, rows = device(), []
    for model_name, (make, shape) in _models(quick).items():
        torch.manual_seed(0)
        twins = {"our DDP": DistributedDataParallel(make().to(dev)),
                 "torch DDP": nn.parallel.DistributedDataParallel(make().to(dev))}
        x, y = torch.randn(*shape, device=dev), torch.randint(0, 10, (shape[0],), device=dev)
        opts = {k: torch.optim.SGD(m.parameters(), lr=0.01) for k, m in twins.items()}

        def step(k):
            opts[k].zero_grad()
            F.cross_entropy(twins[k](x), y).backward()
            opts[k].step()
        samples = time_alternating({k: (lambda k=k: step(k)) for k in twins},
                                   repeats=10 if quick else 50, warmup=3)
        for k, v in samples.items():
            s = summarize(v)
            rows.append({"part": "ddp", "what": model_name, "who": k, "world_size": world_size,
                         "backend": dist.get_backend(), "bytes": 0, "median_ms": 1e3 * s["median"],
                         "min_ms": 1e3 * s["min"], "gpu": gpu_name()})
    dist.barrier()
    return rows


def _all_reduce_worker(rank, world_size, quick, dev=None):
    """Our ring all-reduce and torch's on CUDA tensors of each size (`dev`: another device)."""
    from dist_sgd.comm import collectives as ours
    from dist_sgd.plumbing.rank import device
    rows = []
    # NCCL: this rank's own GPU; gloo: the ranks share GPU 0
    dev = torch.device(dev) if dev else device() if dist.get_backend() == "nccl" else \
        torch.device("cuda", 0)
    for n in SIZES[:3] if quick else SIZES:
        t = torch.ones(n // 4, device=dev)
        samples = time_alternating({"ours (ring)": lambda: ours.all_reduce(t),
                                    "torch": lambda: dist.all_reduce(t)},
                                   repeats=5 if quick else 20, warmup=2)
        for k, v in samples.items():
            s = summarize(v)
            rows.append({"part": "all_reduce", "what": f"{dist.get_backend()}, {world_size} "
                         f"rank{'s' * (world_size > 1)}", "who": k, "world_size": world_size,
                         "backend": dist.get_backend(), "bytes": n,
                         "median_ms": 1e3 * s["median"], "min_ms": 1e3 * s["min"],
                         "gpu": gpu_name()})
    return rows


def measure(quick=False):
    why = no_gpu()
    if why:
        raise Skip(why)
    rows = []
    if dist.is_nccl_available():
        rows += launch(_ddp_worker, 1, quick, backend="nccl")[0]
        rows += launch(_all_reduce_worker, 1, quick, backend="nccl")[0]
    rows += launch(_all_reduce_worker, 2, quick, backend="gloo")[0]
    write_csv(NAME, rows, facts=f"{gpu_name()}, torch {torch.__version__}")
    return rows


def load():
    try:
        return read_csv(NAME)[0]
    except FileNotFoundError:
        return None  # nobody has measured it on a GPU yet


def report(rows):
    for what in dict.fromkeys(r["what"] for r in rows if r["part"] == "ddp"):
        t = {r["who"]: r["median_ms"] for r in rows if r["part"] == "ddp" and r["what"] == what}
        print(f"  {what}: our DDP {t['our DDP']:.3f} ms, torch DDP {t['torch DDP']:.3f} ms per "
              f"step: ours / torch = {t['our DDP'] / t['torch DDP']:.2f}x (target 1.10x)")
    for what in dict.fromkeys(r["what"] for r in rows if r["part"] == "all_reduce"):
        mine = [r for r in rows if r["part"] == "all_reduce" and r["what"] == what]
        for n in dict.fromkeys(r["bytes"] for r in mine):
            t = {r["who"]: r["median_ms"] for r in mine if r["bytes"] == n}
            print(f"  all_reduce {what}, {n:>9,d} B: ours {t['ours (ring)']:.3f} ms, torch "
                  f"{t['torch']:.3f} ms ({t['ours (ring)'] / t['torch']:.2f}x)")


def draw():
    rows = load()
    if not rows:
        return []
    from dist_sgd.bench.plots import bytes_axis, figure, finish
    facts = read_csv(NAME)[1]
    fig, axes = figure(2)
    ddp = [r for r in rows if r["part"] == "ddp"]
    whats = list(dict.fromkeys(r["what"] for r in ddp))
    for i, who in enumerate(("our DDP", "torch DDP")):
        ms = [next(r["median_ms"] for r in ddp if r["what"] == w and r["who"] == who)
              for w in whats]
        axes[0][0].bar([j + 0.4 * i for j in range(len(whats))], ms, width=0.4, label=who)
    axes[0][0].set_xticks([j + 0.2 for j in range(len(whats))], whats, fontsize=8)
    axes[0][0].set(ylabel="ms per training step (median)", title="DDP step, one GPU")
    axes[0][0].legend()
    ar = [r for r in rows if r["part"] == "all_reduce"]
    for what in dict.fromkeys(r["what"] for r in ar):
        for who, style in (("ours (ring)", "-o"), ("torch", "--s")):
            mine = [r for r in ar if r["what"] == what and r["who"] == who]
            axes[0][1].plot([r["bytes"] for r in mine], [r["median_ms"] for r in mine], style,
                            label=f"{who}, {what}")
    bytes_axis(axes[0][1])
    axes[0][1].set(yscale="log", xlabel="tensor size", ylabel="ms (median)",
                   title="all-reduce on CUDA tensors")
    axes[0][1].legend(fontsize=8)
    gpu = rows[0]["gpu"]
    return [finish(fig, NAME, f"Ours against torch's on a GPU: {gpu}", facts)]
