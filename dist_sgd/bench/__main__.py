"""The benchmark: measure every figure of figures/ again, write <name>.csv, draw <name>.png.

    python3 -m dist_sgd.bench                  # everything, full size, into ~/.cache/dist_sgd
    python3 -m dist_sgd.bench --save-figures   # the same, into figures/ of this checkout
    python3 -m dist_sgd.bench --quick          # small sizes, into a fresh temporary folder
    python3 -m dist_sgd.bench allreduce p2p    # only these measurements
    python3 -m dist_sgd.bench --redraw         # every table and PNG from figures/'s CSVs
    sudo python3 -m dist_sgd.bench netscale nettrain netaccuracy   # emulated networks (root)
    python3 -m dist_sgd.bench gpu --save-figures   # on a CUDA GPU: ours vs torch's (bench/gpu.py)

`gpu` needs a CUDA GPU: without one, asked for alone, it says so in one line and exits with
code 2 (nothing measured); in a run of every part it is skipped with that reason.

It prints what each part will take (ESTIMATES, for a quiet 2-core machine) and a line per
part as it runs. Without root the parts on emulated nodes are skipped with the reason.

Where it writes, and what each measurement module provides: main()'s docstring.
"""
import argparse
import importlib
import os
import shutil
import sys
import tempfile
import time
import traceback

from dist_sgd.bench.common import Skip
from dist_sgd.plumbing.figures import DEFAULT_FOLDER, folder, machine_facts, read_csv
from dist_sgd.scale.netns import privilege_problem

# In this order: atscale reads p2p's fit.
MEASUREMENTS = {
    "p2p": "figure 2: point-to-point latency and bandwidth (ping-pong)",
    "allreduce": "figure 1: all-reduce bus bandwidth, every algorithm of ours vs gloo, p = 2-4",
    "scaling": "figure 3: samples/s and efficiency vs world size, strong and weak",
    "breakdown": "figure 4: where a step's time goes (compute, communication, waiting)",
    "ddp": "figure 5 and more: our DDP vs torch DDP, bucket sweep, backward timeline",
    "comparison": "lesson 09 --save-figures: every way to train side by side (loss, time, memory)",
    "cluster": "lesson 11: 2 nodes on a 1 Gbit/s link (root)",
    "compress": "lesson 12: compression hooks (bytes, step time, error feedback); on a link (root)",
    "atscale": "figure 6: the cost model at 1..1024 workers vs published results",
    "zero": "lesson 13: ZeRO-1 optimizer state per rank, bytes and time per step vs torch's",
    "beyond": "lesson 15: parameter server, async SGD, Hogwild, local SGD vs all-reduce SGD",
    "fsdp": "lesson 16: FSDP memory and bytes per rank (p = 1-4); BigNet on 2 nodes (root)",
    "netscale": "lesson 10: all-reduce on 2-16 emulated nodes at 100 Mbit/s, vs the model (root)",
    "nettrain": "lesson 10: weak scaling of a DDP step on 1-8 emulated nodes, vs the model (root)",
    "netaccuracy": "lesson 10: time and bytes to a test accuracy on 4 slow nodes (root)",
    "large_batch": "lesson 18: test accuracy vs global batch, 5 lr recipes; noise scale, B_crit",
    "modelpar": "lessons 19-20: data, tensor and pipeline parallelism on 2-4 nodes (root)",
    "gpu": "a CUDA GPU: our DDP and all-reduce vs torch's, NCCL and gloo on CUDA tensors",
}
# Minutes each part takes on a quiet 2-core machine: (full size, --quick), then what its parts
# on emulated nodes add as root (full, --quick). Rough: the first six took 321 s together, the
# network parts as their modules say; every run prints what each part took beside these.
ESTIMATES = {
    "p2p": ((0.5, 0.2), (0, 0)), "allreduce": ((2, 0.5), (0, 0)), "scaling": ((1, 0.3), (0, 0)),
    "breakdown": ((0.5, 0.2), (0, 0)), "ddp": ((1, 0.3), (0, 0)),
    "comparison": ((1, 0.3), (0, 0)), "cluster": ((0, 0), (3, 1)),
    "compress": ((2, 0.5), (3, 1)), "atscale": ((0.5, 0.2), (0, 0)), "zero": ((1, 0.3), (0, 0)),
    "beyond": ((5, 1), (0, 0)), "fsdp": ((0.5, 0.2), (1, 1)), "netscale": ((0, 0), (15, 2)),
    "nettrain": ((0, 0), (6, 1)), "netaccuracy": ((0, 0), (10, 1)),
    "large_batch": ((15, 1), (0, 0)),
    "modelpar": ((0, 0), (1, 1)),
    "gpu": ((2, 0.5), (0, 0)),  # on a GPU machine; skipped at once without one
}


def estimate(name, quick, root):
    """Minutes `name` should take here: its own part, plus its emulated nodes' as root."""
    (alone, quick_alone), (nodes, quick_nodes) = ESTIMATES[name]
    return (quick_alone if quick else alone) + ((quick_nodes if quick else nodes) if root else 0)


def choose_folder(quick, save_figures, redraw):
    """Where this run writes (see the module's docstring); sets $DIST_SGD_FIGURES to it, so
    every module, and lesson 09 run by the comparison, writes there."""
    if not os.environ.get("DIST_SGD_FIGURES"):
        if save_figures:
            os.environ["DIST_SGD_FIGURES"] = DEFAULT_FOLDER
        elif redraw:  # the committed CSVs, drawn elsewhere
            os.environ["DIST_SGD_FIGURES"] = tempfile.mkdtemp(prefix="dist_sgd_redrawn_")
            for name in os.listdir(DEFAULT_FOLDER):
                if name.endswith(".csv"):
                    shutil.copy(os.path.join(DEFAULT_FOLDER, name), folder())
        elif quick:
            os.environ["DIST_SGD_FIGURES"] = tempfile.mkdtemp(prefix="dist_sgd_quick_figures_")
        else:
            cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
            os.environ["DIST_SGD_FIGURES"] = os.path.join(cache, "dist_sgd", "figures")
    os.makedirs(folder(), exist_ok=True)
    return folder()


def _load(module, name):
    if hasattr(module, "load"):
        return module.load()
    try:
        return read_csv(getattr(module, "NAME", name))[0]
    except FileNotFoundError:
        return None


def run_one(name, quick, redraw):
    """Measure (unless redraw), report, draw; return the paths of the PNGs drawn."""
    module = importlib.import_module(f"dist_sgd.bench.{name}")
    rows = _load(module, name) if redraw else module.measure(quick)
    if rows is not None:
        module.report(rows)
    return module.draw()


def minutes(m):
    return f"{m:.0f} min" if m >= 1 else f"{max(m * 60, 1):.0f} s"


def main(argv=None):
    """The command line (the module's docstring says what it runs).

    The folder: $DIST_SGD_FIGURES if set; else --save-figures: figures/ of this checkout, as
    lessons do (measure on a quiet machine before committing what it writes there); else --quick:
    a fresh temporary folder (quick numbers are too rough to keep); else --redraw: a fresh
    temporary folder holding a copy of figures/'s CSVs; else ~/.cache/dist_sgd/figures
    ($XDG_CACHE_HOME/dist_sgd/figures). `--redraw --save-figures` redraws figures/ itself.

    Each measurement is a module of this package with measure(quick) -> rows (also written as
    CSVs), report(rows) (prints the numbers: ratios, fits) and draw() (reads the CSVs, writes
    PNGs). --redraw reports from the CSVs (the module's load(), else its NAME.csv) and draws. A
    measurement that cannot run here raises common.Skip and is skipped with its reason; one that
    fails does not stop the others: the run goes on, says which failed and why at the end, and
    exits with code 1.
    """
    parser = argparse.ArgumentParser(
        prog="python3 -m dist_sgd.bench", description=__doc__.split("\n\nEach measurement")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="measurements:\n" + "\n".join(f"  {k:11s} {v}" for k, v in MEASUREMENTS.items()))
    parser.add_argument("what", nargs="*", metavar="NAME",
                        help="measurements to run (default: all, in the order listed below)")
    parser.add_argument("--quick", action="store_true",
                        help="small sizes; into a temporary folder unless DIST_SGD_FIGURES is set")
    parser.add_argument("--save-figures", action="store_true",
                        help="write into figures/ of this checkout (default: ~/.cache/dist_sgd)")
    parser.add_argument("--redraw", action="store_true",
                        help="redraw the PNGs from the CSVs, measure nothing (default: figures/'s "
                             "CSVs, into a temporary folder)")
    args = parser.parse_args(argv)
    unknown = [w for w in args.what if w not in MEASUREMENTS]
    if unknown:
        parser.error(f"unknown measurement(s) {unknown}; choose from {list(MEASUREMENTS)}")
    if args.quick and args.save_figures and not args.redraw:
        parser.error("--quick numbers are too rough for figures/: leave out --save-figures")
    names = [n for n in MEASUREMENTS if n in args.what] if args.what else list(MEASUREMENTS)
    if names == ["gpu"] and not args.redraw:
        from dist_sgd.bench.gpu import no_gpu
        if no_gpu():
            print(f"dist_sgd.bench gpu: {no_gpu()}; run it on a machine with a CUDA GPU",
                  file=sys.stderr)
            return 2

    out = choose_folder(args.quick, args.save_figures, args.redraw)
    mode = "redraw from CSVs" if args.redraw else ("quick" if args.quick else "full")
    print(f"dist_sgd.bench ({mode}): {', '.join(names)} -> {out}", flush=True)
    print(f"machine: {machine_facts()}", flush=True)
    root_problem = None if args.redraw else privilege_problem()
    plan = {n: 0.1 if args.redraw else estimate(n, args.quick, root_problem is None)
            for n in names}
    if not args.redraw:
        print(f"about {minutes(sum(plan.values()))} in all (estimates for a quiet 2-core "
              "machine):", flush=True)
        for n in names:
            rooted = ESTIMATES[n][1][0] > 0
            note = ("; its emulated nodes skipped here (no root)" if rooted and root_problem
                    else ", emulated nodes included" if rooted else "")
            print(f"  {n:11s} about {minutes(plan[n])}{note}", flush=True)
        if root_problem:
            print(f"  (emulated nodes: {root_problem})", flush=True)

    failed, skipped, took, total_start = [], [], {}, time.perf_counter()
    for i, name in enumerate(names, 1):
        left = sum(plan[n] for n in names[i - 1:])
        print(f"\n[{i}/{len(names)}] {name}: {MEASUREMENTS[name]} (about {minutes(plan[name])}; "
              f"{minutes(left)} left, {minutes((time.perf_counter() - total_start) / 60)} so far)",
              flush=True)
        start = time.perf_counter()
        try:
            pngs = run_one(name, args.quick, args.redraw)
        except Skip as e:
            skipped.append((name, str(e)))
            print(f"[{i}/{len(names)}] {name}: skipped: {e}", flush=True)
            continue
        except Exception as e:  # noqa: BLE001 - keep going; report every failure at the end
            traceback.print_exc()
            failed.append((name, f"{type(e).__name__}: {e}".splitlines()[0]))
            print(f"[{i}/{len(names)}] {name}: FAILED after {time.perf_counter() - start:.1f} s",
                  flush=True)
            continue
        finally:
            took[name] = time.perf_counter() - start
        shown = ", ".join(os.path.relpath(p, out) for p in pngs or [])
        print(f"[{i}/{len(names)}] {name}: done in {took[name]:.1f} s -> {shown}", flush=True)

    print(f"\nfinished in {minutes((time.perf_counter() - total_start) / 60)}; figures in {out}")
    print("  took: " + ", ".join(f"{n} {took[n]:.0f} s (about {minutes(plan[n])})" for n in took))
    for name, why in skipped:
        print(f"  skipped {name}: {why}")
    for name, why in failed:
        print(f"  FAILED {name}: {why}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
