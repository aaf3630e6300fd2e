"""What every benchmark shares: Skip, and running one measurement at several world sizes while
keeping what worked when one of them fails. (CSVs: dist_sgd.plumbing.figures.)

A full benchmark run is long and unattended: if world size 4 fails, the numbers for 1, 2 and
3 are still worth a CSV (and a figure, with `python -m dist_sgd.bench --redraw NAME`).
"""
from dist_sgd.plumbing.figures import read_csv, write_csv
from dist_sgd.plumbing.launch import RankError, launch


class Skip(Exception):
    """Raised by a measurement that cannot run on this machine; the message says why."""


class PartialResults(RuntimeError):
    """Some world sizes failed; the CSV holds the others."""


def over_world_sizes(name, worker, world_sizes, *args, finish=None):
    """launch(worker, p, *args) for each p; rank 0's list of rows from each, concatenated.

    finish(rows) may add columns before the CSV `name` is written. Returns the rows; raises
    PartialResults (after writing the CSV of the world sizes that worked) when one failed.
    """
    rows, failed = [], []
    for p in world_sizes:
        print(f"  {name} at world size {p}", flush=True)
        try:
            # gloo even where GPUs exist: these figures measure CPU processes (the README's laptop)
            rows += launch(worker, p, *args, backend="gloo")[0]
        except RankError as e:
            print(f"  {name} at world size {p} FAILED: {str(e).splitlines()[0]}", flush=True)
            failed.append((p, e))
    rows = finish(rows) if finish and rows else rows
    if rows:
        write_csv(name, rows)
    if failed:
        detail = "\n".join(f"--- world size {p} ---\n{e}" for p, e in failed)
        kept = sorted({r["world_size"] for r in rows})
        holds = f"; {name}.csv holds {kept} (--redraw {name} draws it)" if rows else ""
        raise PartialResults(f"{name}: world sizes {[p for p, _ in failed]} failed{holds}"
                             f"\n{detail}")
    return rows


def measured_as_root(name):
    """(rows, facts) of <name>.csv, or None, said, when nobody has measured it as root."""
    try:
        return read_csv(name)
    except FileNotFoundError:
        print(f"{name}: no {name}.csv yet (measure it as root first); nothing to draw")
        return None
