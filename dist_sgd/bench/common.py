"""What every benchmark shares: where figures go, the machine facts, CSV in and out.

Each figure is drawn from a CSV that sits beside it in figures/, so a figure can always be
redrawn (and checked) from the numbers it shows. The CSV's first line is a comment with the
machine facts, because a time means nothing without the hardware it was measured on.
"""
import csv
import os
import platform

import torch

FIGURES_DIR = os.environ.get(
    "DIST_SGD_FIGURES", os.path.join(os.path.dirname(__file__), "..", "..", "figures"))


def machine_facts(threads_per_rank=1):
    """A one-line description of the hardware and software a measurement ran on."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (f"{os.cpu_count()} cores ({cpu}), {gpu}, {threads_per_rank} thread(s) per rank, "
            f"torch {torch.__version__}, Python {platform.python_version()}")


def figure_path(name):
    os.makedirs(FIGURES_DIR, exist_ok=True)
    return os.path.normpath(os.path.join(FIGURES_DIR, name))


def write_csv(name, rows, facts=None):
    """Write a list of dicts to figures/<name>.csv, machine facts in a leading comment line."""
    path = figure_path(name + ".csv")
    with open(path, "w", newline="") as f:
        f.write(f"# {facts or machine_facts()}\n")
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def read_csv(name):
    """(rows as dicts with numbers converted, machine facts) from figures/<name>.csv."""
    path = figure_path(name + ".csv")
    with open(path, newline="") as f:
        facts = f.readline().lstrip("# ").strip()
        rows = list(csv.DictReader(f))
    for row in rows:
        for key, value in row.items():
            try:
                row[key] = float(value) if any(c in value for c in ".eE") else int(value)
            except (TypeError, ValueError):
                pass
    return rows, facts
