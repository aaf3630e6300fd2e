"""Lesson 09's comparison as a benchmark: run the lesson with --save-figures (its comparison
loop is on its own page, lessons/09_comparison.py), then draw what it wrote:

    comparison.csv        one row per way to train: differences, accuracy, ms/step, memory
    comparison_loss.csv   the loss of every global batch, per way
    comparison_loss.png   the loss curves and their difference from one process
    comparison_time.png   time per step and peak memory, per way

(Where a step's time goes, computing or communicating, is the breakdown figure's subject.)
"""
import os
import subprocess
import sys

from dist_sgd.bench.common import Skip
from dist_sgd.plumbing.figures import folder, read_csv

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LESSON = "lessons.09_comparison"  # run as `python -m` from ROOT: see measure()


def measure(quick=False):
    """Run lesson 09 at world size 2 (its output goes by); return the rows it wrote.

    `python -m lessons.09_comparison` run in the checkout's root puts that root first on the
    lesson's sys.path, so the lesson and its spawned ranks import this checkout's dist_sgd,
    whatever is installed, and PYTHONPATH is left as it is. Its --save-figures writes into
    $DIST_SGD_FIGURES: the benchmark's folder."""
    if not os.path.exists(os.path.join(ROOT, "lessons", "09_comparison.py")):
        raise Skip(f"no lessons/09_comparison.py in {ROOT} (an installed package?)")
    subprocess.run([sys.executable, "-m", LESSON, "--world-size", "2", "--save-figures",
                    *(["--quick"] if quick else [])],
                   cwd=ROOT, env=dict(os.environ, DIST_SGD_FIGURES=folder()), check=True)
    return load()


def load():
    return read_csv("comparison")[0]


def report(rows):
    print(f"  {'strategy':20s} {'ms/step':>8s} {'test accuracy':>14s} {'vs torch DDP, end':>18s}")
    for r in rows:
        print(f"  {r['strategy']:20s} {r['step_ms']:8.2f} {r['accuracy']:14.2%} "
              f"{r['vs_torch_ddp']:18.1e}")


def draw():
    from dist_sgd.bench import plots  # matplotlib: only where we draw (ranks never need it)

    rows, facts = read_csv("comparison")
    curves, _ = read_csv("comparison_loss")
    names = [r["strategy"] for r in rows]
    fig, axes = plots.figure(2, width=6)
    single = [c["loss"] for c in curves if c["strategy"] == names[0]]
    for i, name in enumerate(names):
        loss = [c["loss"] for c in curves if c["strategy"] == name]
        style = {"label": name, "ls": ("-", "--", ":", "-.")[i % 4], "color": plots.color(name)}
        axes[0][0].plot(loss, lw=1.2, **style)
        if i:
            axes[0][1].plot([abs(a - b) + 1e-12 for a, b in zip(loss, single)], lw=1, **style)
    axes[0][0].set(xlabel="step (global batch)", ylabel="training loss (nll)",
                   title="loss of every global batch")
    axes[0][1].set(xlabel="step (global batch)", ylabel=f"|loss - {names[0]}'s loss|",
                   yscale="log", title=f"difference from {names[0]}")
    for ax in axes[0]:
        ax.legend(fontsize=8)
    paths = [plots.finish(fig, "comparison_loss",
                          f"Same data, same seeds: {len(names)} ways to train, one curve", facts,
                          "right: curves that coincide hide each other; 1e-12 stands for 0")]
    fig, axes = plots.figure(2, width=6)
    y = range(len(rows))
    axes[0][0].barh(y, [r["step_ms"] for r in rows], color="tab:green",
                    label="one step, slowest rank")
    axes[0][0].set(xlabel="ms per step (median)", title="time per step")
    axes[0][0].set_xlim(0, 1.6 * max(r["step_ms"] for r in rows))  # room for the legend
    axes[0][1].barh(y, [r["peak_mib"] for r in rows], color="tab:gray", label="peak resident set")
    axes[0][1].set(xlabel="MiB (peak per process)", title="peak memory")
    for ax in axes[0]:
        ax.set_yticks(list(y), names)
        ax.invert_yaxis()
        ax.legend(fontsize=8, loc="upper right")
    paths.append(plots.finish(fig, "comparison_time", "Time per step and memory, per strategy",
                              facts, "memory: ru_maxrss (resident set) of each process; "
                              + ("cumulative over the strategies each process ran"
                                 if rows[0]["memory"] == "cumulative" else "fresh processes")))
    return paths
