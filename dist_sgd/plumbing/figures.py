"""Where figures and their numbers live: figures/<name>.csv, read and written the same way
by the benchmark (`python -m dist_sgd.bench`) and by the lessons that quote them (the
summaries of the network CSVs that lessons 10 and 12 quote: dist_sgd/scale/summaries.py).

Each figure is drawn from a CSV beside it, so it can always be redrawn (and checked) from the
numbers it shows. The CSV's first line is a comment with the machine facts, because a time
means nothing without the hardware it was measured on. DIST_SGD_FIGURES names another folder
(the benchmark writes to one outside the checkout unless told --save-figures).
"""
import csv
import os
import platform

import torch

DEFAULT_FOLDER = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "figures"))


def folder():
    """The figures folder: $DIST_SGD_FIGURES if set, else figures/ of this checkout."""
    return os.environ.get("DIST_SGD_FIGURES") or DEFAULT_FOLDER


def figure_path(name):
    os.makedirs(folder(), exist_ok=True)
    return os.path.normpath(os.path.join(folder(), name))


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


def write_csv(name, rows, facts=None):
    """Write a list of dicts to <folder>/<name>.csv, machine facts in a leading comment line."""
    path = figure_path(name + ".csv")
    with open(path, "w", newline="") as f:
        f.write(f"# {facts or machine_facts()}\n")
        # every key of every row, in the order first seen (a part's rows may carry a column
        # the others leave empty)
        writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)),
                                restval="")
        writer.writeheader()
        writer.writerows(rows)
    return path


def read_csv(name):
    """(rows as dicts with numbers converted, machine facts) from <folder>/<name>.csv."""
    with open(os.path.join(folder(), name + ".csv"), newline="") as f:
        facts = f.readline().lstrip("# ").strip()
        rows = list(csv.DictReader(f))
    for row in rows:
        for key, value in row.items():
            try:
                row[key] = float(value) if any(c in value for c in ".eEn") else int(value)
            except (TypeError, ValueError):
                pass
    return rows, facts
