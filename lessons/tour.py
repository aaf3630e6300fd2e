"""The lesson tour: every lesson in order, each as its own program.

    python lessons/tour.py            # every lesson at its default size
    python lessons/tour.py --quick    # every lesson at tiny size

Each lesson is its own program (run one alone with `python lessons/NN_name.py`); the tour
only runs them one after another, stops at the first that fails, and says which. Lessons
write nothing into the repository; the figures in figures/ are measured by the benchmark
command the README gives next to this one.
"""
import argparse
import glob
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def lessons():
    return sorted(glob.glob(os.path.join(HERE, "[0-9][0-9]_*.py")))


def run(title, cmd):
    print(f"\n{'=' * 78}\n{title}\n$ {' '.join(cmd)}\n{'=' * 78}", flush=True)
    start = time.perf_counter()
    code = subprocess.call(cmd, cwd=ROOT)
    seconds = time.perf_counter() - start
    if code != 0:
        sys.exit(f"\ntour stopped: `{' '.join(cmd)}` failed with exit code {code}")
    return seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes")
    args = parser.parse_args()
    extra = ["--quick"] if args.quick else []
    times = []
    for path in lessons():
        name = os.path.relpath(path, ROOT)
        times.append((name, run(f"lesson {name}", [sys.executable, name] + extra)))
    print("\ntour finished:")
    for name, seconds in times:
        print(f"  {name:42s} {seconds:7.1f} s")


if __name__ == "__main__":
    main()
