"""Regenerate every figure: measure, write figures/<name>.csv, draw figures/<name>.png from it.

    python -m dist_sgd.bench                  # everything, full size (< 10 min on 2 cores)
    python -m dist_sgd.bench --quick          # small sizes (a few minutes), into a temp folder
    python -m dist_sgd.bench allreduce p2p    # only these measurements
    python -m dist_sgd.bench --redraw         # redraw every PNG from its CSV, no measuring
    DIST_SGD_FIGURES=/tmp/figs python -m dist_sgd.bench --quick   # choose the folder

Each measurement is a module of this package with measure(quick) -> rows (also written as
CSVs), report(rows) (prints the numbers: ratios, fits, goals) and draw() (reads the CSVs,
writes PNGs). --redraw reports from the CSVs (the module's load(), else its NAME.csv) and
draws. A measurement that cannot run here raises common.Skip and is skipped with its reason;
one that fails does not stop the others: the run goes on, says which failed and why at the
end, and exits with code 1.

--quick numbers are too rough to commit, so unless DIST_SGD_FIGURES names a folder they go
to a fresh temporary one and figures/ is left alone.
"""
import argparse
import importlib
import os
import sys
import tempfile
import time
import traceback

from dist_sgd.bench import common

# In this order: atscale reads p2p's fit.
MEASUREMENTS = {
    "p2p": "figure 2: point-to-point latency and bandwidth (ping-pong)",
    "allreduce": "figure 1: all-reduce bus bandwidth, every algorithm of ours vs gloo, p = 2, 3, 4",
    "scaling": "figure 3: samples/s and efficiency vs world size, strong and weak",
    "breakdown": "figure 4: where a step's time goes (compute, communication, waiting)",
    "ddp": "figure 5 and more: our DDP vs torch DDP, bucket sweep, backward timeline",
    "comparison": "lesson 09 --save-figures: every way to train side by side (loss, time, memory)",
    "cluster": "lesson 11: 2 nodes on a 1 Gbit/s link (needs root; skips otherwise)",
    "compress": "lesson 12: compression hooks (bytes, step time ours vs torch's, error feedback)",
    "atscale": "figure 6: the cost model at 1..1024 workers vs published results",
    "zero": "lesson 13: ZeRO-1 optimizer state per rank, bytes and time per step vs torch's",
    "beyond": "lesson 15: parameter server, async SGD, Hogwild, local SGD vs all-reduce SGD",
    "fsdp": "lesson 16: FSDP memory and bytes per rank (p = 1-4); BigNet on 2 nodes (needs root)",
    "netscale": "lesson 10: all-reduce on 2-16 emulated nodes at 100 Mbit/s, vs the model (root)",
    "nettrain": "lesson 10: weak scaling of a DDP step on 1-8 emulated nodes, vs the model (root)",
    "netaccuracy": "lesson 10: time and bytes to a test accuracy on 4 slow nodes (root)",
}


def _load(module, name):
    if hasattr(module, "load"):
        return module.load()
    try:
        return common.read_csv(getattr(module, "NAME", name))[0]
    except FileNotFoundError:
        return None


def run_one(name, quick, redraw):
    """Measure (unless redraw), report, draw; return the paths of the PNGs drawn."""
    module = importlib.import_module(f"dist_sgd.bench.{name}")
    rows = _load(module, name) if redraw else module.measure(quick)
    if rows is not None:
        module.report(rows)
    return module.draw()


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m dist_sgd.bench", description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="measurements:\n" + "\n".join(f"  {k:10s} {v}" for k, v in MEASUREMENTS.items()))
    parser.add_argument("what", nargs="*", metavar="NAME",
                        help="measurements to run (default: all, in the order listed below)")
    parser.add_argument("--quick", action="store_true",
                        help="small sizes; into a temporary folder unless DIST_SGD_FIGURES is set")
    parser.add_argument("--redraw", action="store_true",
                        help="redraw the PNGs from the CSVs already there, measure nothing")
    args = parser.parse_args(argv)
    unknown = [w for w in args.what if w not in MEASUREMENTS]
    if unknown:
        parser.error(f"unknown measurement(s) {unknown}; choose from {list(MEASUREMENTS)}")
    names = [n for n in MEASUREMENTS if n in args.what] if args.what else list(MEASUREMENTS)

    if args.quick and not args.redraw and not os.environ.get("DIST_SGD_FIGURES"):
        os.environ["DIST_SGD_FIGURES"] = tempfile.mkdtemp(prefix="dist_sgd_quick_figures_")
    folder = common.folder()
    mode = "redraw from CSVs" if args.redraw else ("quick" if args.quick else "full")
    print(f"dist_sgd.bench ({mode}): {', '.join(names)} -> {folder}", flush=True)
    print(f"machine: {common.machine_facts()}", flush=True)

    failed, skipped, total_start = [], [], time.perf_counter()
    for i, name in enumerate(names, 1):
        print(f"\n[{i}/{len(names)}] {name}: {MEASUREMENTS[name]}", flush=True)
        start = time.perf_counter()
        try:
            pngs = run_one(name, args.quick, args.redraw)
        except common.Skip as e:
            skipped.append((name, str(e)))
            print(f"[{i}/{len(names)}] {name}: skipped: {e}", flush=True)
            continue
        except Exception as e:  # noqa: BLE001 - keep going; report every failure at the end
            traceback.print_exc()
            failed.append((name, f"{type(e).__name__}: {e}".splitlines()[0]))
            print(f"[{i}/{len(names)}] {name}: FAILED after {time.perf_counter() - start:.1f} s",
                  flush=True)
            continue
        shown = ", ".join(os.path.relpath(p, folder) for p in pngs or [])
        print(f"[{i}/{len(names)}] {name}: done in {time.perf_counter() - start:.1f} s -> {shown}",
              flush=True)

    print(f"\nfinished in {time.perf_counter() - total_start:.1f} s; figures in {folder}")
    for name, why in skipped:
        print(f"  skipped {name}: {why}")
    for name, why in failed:
        print(f"  FAILED {name}: {why}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
