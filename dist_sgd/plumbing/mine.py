"""The switch that puts a learner's code where the library's piece was: DIST_SGD_MINE=DIR.

A module that holds an exercise ends with the names it offers a learner to replace:

    swap_in(globals(), "average_gradients", ("average_gradients",), lesson="06")

Without DIST_SGD_MINE this does nothing. With DIST_SGD_MINE=DIR (the course command sets it,
and so can you: `DIST_SGD_MINE=mine python3 lessons/06_distributed_sgd.py`), when DIR holds
the learner's file for that exercise (DIR/average_gradients.py, written by `course start`),
the file is loaded and its definitions replace the exercise's names in the module, so every
importer gets them: tests, lessons, spawned ranks and torchrun workers (each inherits the
variable). Each process that swaps says so once, on stderr. DIST_SGD_MINE_ONLY=a,b limits the
swap to those exercises (names or lesson numbers): `course check` grades one piece at a time
while the rest stay the library's.

This module imports nothing of torch or dist_sgd: every module with an exercise imports it, at
the ground floor. The course's registry lists the same names and lessons; tests/test_course.py
checks that the two agree.
"""
import importlib.util
import os
import sys

MINE = "DIST_SGD_MINE"
ONLY = "DIST_SGD_MINE_ONLY"
QUIET = "DIST_SGD_MINE_QUIET"  # set by `course check` for its graders' ranks: it says it once
_announced = set()


def learner_dir():
    """DIR of DIST_SGD_MINE, or None when the switch is off."""
    return os.environ.get(MINE) or None


def selected(name, lesson=None):
    """Does DIST_SGD_MINE_ONLY (unset: everything) include this exercise?"""
    only = os.environ.get(ONLY)
    if not only:
        return True
    wanted = {w.strip() for w in only.split(",") if w.strip()}
    return name in wanted or (lesson is not None and lesson in wanted)


def load_file(path, module_name=None):
    """Run a Python file as a fresh module (its own namespace) and return the module."""
    path = os.path.abspath(path)
    module_name = module_name or "dist_sgd_mine_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses, pickle and friends look a module up here
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module


def _who():
    rank = os.environ.get("RANK")
    return f"[rank {rank}] " if rank is not None else ""


def swap_in(namespace, name, symbols, lesson=None):
    """Replace `symbols` in `namespace` (a module's globals()) by the learner's, when the switch
    is on, exercise `name` is selected (by name, or by `lesson`'s number) and DIR/<name>.py
    exists. Returns the learner's module or None."""
    folder = learner_dir()
    if folder is None:
        return None
    path = os.path.join(folder, name + ".py")
    if not (selected(name, lesson) and os.path.exists(path)):
        return None
    module = load_file(path, "dist_sgd_mine_" + name)
    missing = [s for s in symbols if not hasattr(module, s)]
    if missing:
        raise ImportError(f"{path} must define {', '.join(missing)} (the names the exercise "
                          f"replaces); the course's `start {name}` writes them (README: "
                          "'Your turn')")
    for symbol in symbols:
        namespace[symbol] = getattr(module, symbol)
    if (name, os.getpid()) not in _announced and not os.environ.get(QUIET):
        _announced.add((name, os.getpid()))
        shown = os.path.relpath(path) if not os.path.relpath(path).startswith("..") else path
        print(f"{_who()}using {', '.join(symbols)} from {shown} (process {os.getpid()})",
              file=sys.stderr, flush=True)
    return module
