"""The look every figure shares: Agg backend, byte-size axes, one colour per strategy and
algorithm, a title and a hardware caption."""
import os

import matplotlib

matplotlib.use("Agg")  # no display needed: figures are files
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from dist_sgd.plumbing.figures import figure_path  # noqa: E402
from dist_sgd.scale.costmodel import human_bytes  # noqa: E402

COLORS = {"naive": "tab:gray", "tree": "tab:green", "ring": "tab:blue",
          "ring_pipelined": "tab:cyan", "halving_doubling": "tab:purple", "gloo": "tab:red",
          "parameter_server": "tab:brown",
          "single process": "black", "average_gradients": "tab:orange",
          "per-parameter hooks": "tab:olive", "our DDP": "tab:blue", "torch DDP": "tab:red",
          "our DataParallel": "tab:purple", "torch DataParallel": "tab:pink"}


def color(name):
    """The colour of a strategy or algorithm ("our DDP, 1 MiB" is our DDP's); gray if unknown."""
    return COLORS.get(name, COLORS.get(name.split(",")[0], "tab:gray"))


def cores(facts):
    """The core count of the machine a CSV was measured on (its facts line starts "N cores")."""
    try:
        return int(facts.split()[0])
    except (ValueError, IndexError):
        return os.cpu_count() or 1


def bytes_axis(ax, axis="x"):
    """A log2 axis labelled in B / KiB / MiB."""
    getattr(ax, f"set_{axis}scale")("log", base=2)
    getattr(ax, f"{axis}axis").set_major_formatter(FuncFormatter(lambda n, _pos: human_bytes(n)))


def figure(ncols, nrows=1, width=5.2, height=4.2):
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False)
    return fig, axes


def finish(fig, name, title, facts, note=None):
    """Title on top, machine facts (and a note) underneath, save <figures>/<name>.png."""
    hardware = ", ".join(facts.split(", ")[:2])  # "2 cores (CPU model), no GPU"
    fig.suptitle(f"{title}\n[{hardware}]", fontsize=12)
    caption = f"Measured on: {facts}" + (f"\n{note}" if note else "")
    fig.text(0.5, 0.005, caption, ha="center", va="bottom", fontsize=8.5, wrap=True)
    lines = caption.count("\n") + 1
    fig.tight_layout(rect=(0, 0.025 + 0.03 * lines, 1, 0.93))
    path = figure_path(name + ".png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
