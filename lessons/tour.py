"""The lesson tour: every lesson in order, each as its own program.

    python3 lessons/tour.py --quick    # start here: every lesson at tiny size, a few minutes
    python3 lessons/tour.py            # every lesson at its tour size, about 7 minutes on 2 cores

Each lesson is its own program (run one alone with `python3 lessons/NN_name.py`); the tour
only runs them one after another, stops at the first that fails, and says which. Every
lesson runs at its own default size except those in TOUR_SIZE, whose default measures for
the figures or spends minutes on waits the story needs only once: the tour gives them the
flags listed there, shows them in each lesson's command line, and says at the end why. Lessons
write nothing into the repository (data/, a cache, is ignored by git); the figures in
figures/ are measured by the benchmark command the README gives.
"""
import argparse
import glob
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# lesson number -> (the flags the full tour adds, why). With these the tour takes about 6.5
# minutes on 2 cores as root (lessons 10 and 17 about a minute each). Lesson 10 keeps its size:
# at --quick its loopback fit of alpha and beta can fail on a busy machine.
TOUR_SIZE = {
    "06": (["--quick"], "its full size trains for a minute on real data (the same checks)"),
    "09": (["--quick"], "its full size trains every way for 1.5 minutes on real data"),
    "12": (["--quick"], "its full size measures for figures/ (the benchmark's job)"),
    "13": (["--quick"], "its full size times a 12-layer model for figures/"),
    "14": (["--steps", "100"], "100 steps instead of 200: one kill and one recovery each"),
    # 80 steps leave the node that rejoins ~13 s to be seen (3 s on a quiet machine); a
    # machine too busy for that shows act 1 growing back only at the last step
    "17": (["--quick", "--steps", "80", "--checkpoint-every", "5"],
           "act 1 only (a node lost and back), 80 steps, a checkpoint every 5; acts 2 and 3 "
           "(the store's host lost, and the remedy) run at its full size"),
}


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
    parser.add_argument("--quick", action="store_true", help="every lesson at tiny size")
    args = parser.parse_args()
    times, started, resized = [], time.perf_counter(), []
    for path in lessons():
        name = os.path.relpath(path, ROOT)
        number = os.path.basename(path)[:2]
        if args.quick:
            extra = ["--quick"]
        else:
            extra, why = TOUR_SIZE.get(number, ([], None))
            if why:
                resized.append(f"  {name}: {why} (alone: python3 {name})")
        title = f"lesson {name}" + (" at its tour size" if extra and not args.quick else "")
        times.append((name, run(title, [sys.executable, name] + extra)))
    print("\ntour finished:")
    for name, seconds in times:
        print(f"  {name:42s} {seconds:7.1f} s")
    print(f"  {'all':42s} {time.perf_counter() - started:7.1f} s")
    if resized:
        print("At the tour's size:\n" + "\n".join(resized))


if __name__ == "__main__":
    main()
