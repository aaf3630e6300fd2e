"""Run one measurement at several world sizes; keep what worked when one of them fails.

A full benchmark run is long and unattended: if world size 4 fails, the numbers for 1, 2 and
3 are still worth a CSV (and a figure, with `python -m dist_sgd.bench --redraw NAME`).
"""
from dist_sgd.bench import common
from dist_sgd.launch import RankError, launch


class PartialResults(RuntimeError):
    """Some world sizes failed; the CSV holds the others."""


def over_world_sizes(name, worker, world_sizes, *args, finish=None):
    """launch(worker, p, *args) for each p; rank 0's list of rows from each, concatenated.

    finish(rows) may add columns before the CSV `name` is written. Raises PartialResults
    (after writing the CSV of the world sizes that worked) when any world size failed.
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
    if rows:
        common.write_csv(name, finish(rows) if finish else rows)
    if failed:
        detail = "\n".join(f"--- world size {p} ---\n{e}" for p, e in failed)
        kept = sorted({r["world_size"] for r in rows})
        raise PartialResults(f"{name}: world sizes {[p for p, _ in failed]} failed"
                             + (f"; {name}.csv holds {kept} (--redraw {name} draws it)" if rows else "")
                             + f"\n{detail}")
    return rows
