"""ZeRO-1 (lesson 13): optimizer-state bytes per rank, bytes per step, time per step.

At world sizes 2, 3 and 4, with Adam, for two models:
  "12 equal layers": 12 x Linear(512, 512) (3.15 M parameters): whole-parameter shards balance;
  "BigNet": pytorch/examples' convnet, one layer of which holds 98% of the parameters: whole-
      parameter shards cannot balance (the imbalance is the point of this row).
Counted exactly: the optimizer state each rank holds (tensor bytes) against the plain
optimizer's / p, and the bytes each scheme sends per step (dist_sgd.comm.counted.wire_bytes of the
collectives it called) against plain data parallelism's one all-reduce. Timed, alternated
(A B C D ...), medians of the slowest rank: one step with the gradients already there
(gradient all-reduce + Adam + sharing the parameters) for plain Adam, torch's
ZeroRedundancyOptimizer (default: one broadcast per parameter; and parameters_as_bucket_view=True:
one per rank, as ours), and ours in both schemes, on "12 equal layers" only.
"""
import torch
import torch.nn as nn
from torch.distributed.optim import ZeroRedundancyOptimizer

from dist_sgd.comm.counted import wire_bytes
from dist_sgd.plumbing.figures import read_csv, write_csv
from dist_sgd.plumbing.launch import launch
from dist_sgd.plumbing.timing import summarize, time_alternating
from dist_sgd.sgd.models import BigNet
from dist_sgd.sgd.sync import average_gradients
from dist_sgd.shard.zero import ShardedOptimizer

NAME = "zero"
WORLD_SIZES = (2, 3, 4)
LR = 1e-3
CANDIDATES = ("plain Adam", "torch ZeroRedundancyOptimizer", "torch ZeRO, bucket view",
              "ours broadcast", "ours all_gather")


def equal_layers(width=512, depth=12):
    return nn.Sequential(*[m for _ in range(depth) for m in (nn.Linear(width, width), nn.Tanh())])


MODELS = {"12 equal layers": equal_layers, "BigNet": BigNet}


def _model(make):
    torch.manual_seed(0)
    model = make()
    for p in model.parameters():  # gradients without a forward pass: only bytes matter here
        p.grad = torch.randn_like(p)
    return model


def _state_bytes(opt):
    return sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values()
               if torch.is_tensor(v))


def _worker(rank, world_size, quick):
    rows = []
    for model_name, make in MODELS.items():
        if quick and model_name != "BigNet":
            make = lambda: equal_layers(128, 12)  # noqa: E731 - small, still 12 equal layers
        models, opts = {}, {}
        for name in CANDIDATES:
            models[name] = model = _model(make)
            if name == "plain Adam":
                opts[name] = torch.optim.Adam(model.parameters(), lr=LR)
            elif name.startswith("torch"):  # partitions, steps its shard, broadcasts: no grads
                opts[name] = ZeroRedundancyOptimizer(
                    model.parameters(), torch.optim.Adam, lr=LR,
                    parameters_as_bucket_view=name.endswith("bucket view"))  # one flat buffer
            else:
                opts[name] = ShardedOptimizer(model.parameters(), torch.optim.Adam,
                                              scheme=name.split()[-1], lr=LR)
        steps = {"plain Adam": lambda: (average_gradients(models["plain Adam"], flat=True),
                                        opts["plain Adam"].step()),
                 "torch ZeroRedundancyOptimizer": lambda: (
                     average_gradients(models["torch ZeroRedundancyOptimizer"], flat=True),
                     opts["torch ZeroRedundancyOptimizer"].step()),
                 "torch ZeRO, bucket view": lambda: (
                     average_gradients(models["torch ZeRO, bucket view"], flat=True),
                     opts["torch ZeRO, bucket view"].step()),
                 "ours broadcast": opts["ours broadcast"].step,
                 "ours all_gather": opts["ours all_gather"].step}
        for step in steps.values():  # one step each: the optimizer state exists now
            step()
        grad_bytes = sum(p.numel() * p.element_size() for p in models["plain Adam"].parameters())
        row = {"model": model_name, "world_size": world_size, "rank": rank,
               "parameters": sum(p.numel() for p in models["plain Adam"].parameters()),
               "plain_state_bytes": _state_bytes(opts["plain Adam"]),
               "zero_state_bytes": _state_bytes(opts["ours broadcast"]),
               "torch_zero_state_bytes": _state_bytes(opts["torch ZeroRedundancyOptimizer"].optim),
               "plain_bytes_per_step": wire_bytes("all_reduce", grad_bytes, world_size),
               "broadcast_bytes_per_step": opts["ours broadcast"].bytes_per_step(),
               "all_gather_bytes_per_step": opts["ours all_gather"].bytes_per_step()}
        if model_name != "BigNet":  # time only the model the shards balance on
            samples = time_alternating(steps, repeats=5 if quick else 21)
            for name in CANDIDATES:
                s = summarize(samples[name])
                key = _key(name)
                row.update({f"{key}_ms": 1e3 * s["median"], f"{key}_min_ms": 1e3 * s["min"],
                            f"{key}_max_ms": 1e3 * s["max"]})
            row["repeats"] = len(samples[CANDIDATES[0]])
        rows.append(row)
    torch.distributed.barrier()
    return rows


def measure(quick=False):
    rows = []
    for world_size in WORLD_SIZES:
        for ranks in zip(*launch(_worker, world_size, quick, backend="gloo")):
            rows.extend(ranks)  # every rank's row: the memory is per rank
    write_csv(NAME, _fill(rows))
    return rows


def _key(name):
    return name.replace(",", "").replace(" ", "_")


def _fill(rows):
    """Every row with every column (the timing ones are empty for BigNet)."""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    return [{k: r.get(k, "") for k in keys} for r in rows]


def _per_size(rows, model):
    """{world size: [rows of every rank]} for one model."""
    out = {}
    for r in rows:
        if r["model"] == model:
            out.setdefault(r["world_size"], []).append(r)
    return out


def report(rows):
    print("what each rank holds and sends (bytes exact, counted) and one step's time:")
    for model in MODELS:
        for p, ranks in sorted(_per_size(rows, model).items()):
            ideal = ranks[0]["plain_state_bytes"] / p
            r = ranks[0]
            worst = max(r["zero_state_bytes"] for r in ranks)
            best = min(r["zero_state_bytes"] for r in ranks)
            print(f"  {model} ({r['parameters']:,} parameters), p={p}: optimizer state per rank, "
                  f"largest {worst / 2**20:.2f} MiB = "
                  f"{worst / ideal:.3f} x (plain / p); smallest "
                  f"{best / ideal:.3f} x; imbalance largest/smallest {worst / best:.2f}")
            print(f"      bytes per step vs plain data parallel: broadcast "
                  f"{r['broadcast_bytes_per_step'] / r['plain_bytes_per_step']:.3f}x "
                  f"(1.5 by the formula), all_gather "
                  f"{r['all_gather_bytes_per_step'] / r['plain_bytes_per_step']:.3f}x"
                  f"{'' if worst <= 1.05 * ideal else ' (shards padded to the largest)'}")
            if r.get("ours_broadcast_ms") not in (None, ""):
                ratio = r["ours_broadcast_ms"] / r["torch_ZeroRedundancyOptimizer_ms"]
                print(f"      step time, ours broadcast / torch ZeroRedundancyOptimizer: "
                      f"{r['ours_broadcast_ms']:.1f} / {r['torch_ZeroRedundancyOptimizer_ms']:.1f} "
                      f"ms = {ratio:.2f}x"
                      "; torch's with parameters_as_bucket_view "
                      f"{r['torch_ZeRO_bucket_view_ms']:.1f} "
                      f"ms, ours all_gather {r['ours_all_gather_ms']:.1f} ms, plain Adam "
                      f"{r['plain_Adam_ms']:.1f} ms (medians of {r['repeats']})")


def draw():
    from dist_sgd.bench import plots  # matplotlib: only where we draw (ranks never need it)

    rows, facts = read_csv(NAME)
    report(rows)
    fig, axes = plots.figure(3)
    ax_mem, ax_bytes, ax_time = axes[0]
    for model, marker in zip(MODELS, "os"):
        sizes = _per_size(rows, model)
        ps = sorted(sizes)
        plain = [sizes[p][0]["plain_state_bytes"] / 2**20 for p in ps]
        worst = [max(r["zero_state_bytes"] for r in sizes[p]) / 2**20 for p in ps]
        best = [min(r["zero_state_bytes"] for r in sizes[p]) / 2**20 for p in ps]
        line, = ax_mem.plot(ps, worst, marker + "-", label=f"{model}: ZeRO-1, largest shard")
        ax_mem.plot(ps, best, marker + ":", color=line.get_color(),
                    label=f"{model}: smallest shard")
        ax_mem.plot(ps, [b / p for b, p in zip(plain, ps)], "--", color=line.get_color(), lw=0.8,
                    label=f"{model}: plain / p")
        ax_mem.plot(ps, plain, marker, color=line.get_color(), mfc="none",
                    label=f"{model}: plain Adam ({plain[0]:.1f} MiB)")
        for scheme, ls in (("broadcast", "-"), ("all_gather", "--")):
            ratio = [sizes[p][0][f"{scheme}_bytes_per_step"] / sizes[p][0]["plain_bytes_per_step"]
                     for p in ps]
            ax_bytes.plot(ps, ratio, marker + ls, label=f"{model}: {scheme}")
    ax_mem.set_yscale("log")
    ax_mem.set_xlabel("world size p")
    ax_mem.set_ylabel("Adam state per rank (MiB, log)")
    ax_mem.set_title("optimizer state per rank: 1/p if shards balance")
    ax_mem.legend(fontsize=7)
    ax_bytes.axhline(1.5, color="gray", lw=0.8, ls=":")
    ax_bytes.axhline(1.0, color="gray", lw=0.8, ls=":")
    ax_bytes.set_xlabel("world size p")
    ax_bytes.set_ylabel("bytes sent per step / plain data parallel's")
    ax_bytes.set_title("bytes per step: 1.5x and 1.0x (+ padding)")
    ax_bytes.legend(fontsize=7)
    timed = _per_size(rows, list(MODELS)[0])
    ps = sorted(timed)
    for name in CANDIDATES:
        key = _key(name)
        med = [timed[p][0][f"{key}_ms"] for p in ps]
        lo = [timed[p][0][f"{key}_min_ms"] for p in ps]
        hi = [timed[p][0][f"{key}_max_ms"] for p in ps]
        spread = [[m - a for m, a in zip(med, lo)], [b - m for m, b in zip(med, hi)]]
        ax_time.errorbar(ps, med, yerr=spread, marker="o", capsize=3, label=name)
    ax_time.set_xlabel("world size p (more than 2: ranks share the 2 cores)")
    ax_time.set_ylabel("one step (ms; median, min-max)")
    ax_time.set_title(f"time per step, gradients given, {list(MODELS)[0]}")
    ax_time.legend(fontsize=7)
    for ax in axes[0]:
        ax.set_xticks(ps)
    return [plots.finish(fig, NAME, "ZeRO-1: Adam's state sharded over p ranks (gloo, one host)",
                         facts, note=f"bytes counted exactly; times alternated, medians of "
                                     f"{timed[ps[0]][0]['repeats']} (slowest rank), on a shared, "
                                     "loaded machine")]
