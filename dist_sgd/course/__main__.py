"""python3 -m dist_sgd.course: write each piece yourself; the project's own proofs grade it.

    python3 -m dist_sgd.course list                 every exercise, its lesson, its state
    python3 -m dist_sgd.course start 04             your file to edit: mine/ring_all_reduce.py
    python3 -m dist_sgd.course check 04 [--watch]   grade it (exit 0 iff every check passes)
    python3 -m dist_sgd.course check --list 04      what is checked: each case, what it proves
    python3 -m dist_sgd.course hint 04              the next hint, gentle to nearly the answer
    python3 -m dist_sgd.course progress             what you have started and what passes

EX is an exercise's name (ring_all_reduce) or a lesson number (04: all of that lesson's).
--dir DIR (default mine/, or $DIST_SGD_MINE) is your folder: outside git's view (it holds a
.gitignore of its own), never overwritten by start. Your code runs in the lessons too:
DIST_SGD_MINE=mine python3 lessons/06_distributed_sgd.py trains on your average_gradients.
"""
import argparse
import json
import os
import sys
import textwrap
import time

from dist_sgd.course.exercises import EXERCISES, ROOT, select
from dist_sgd.plumbing.mine import MINE, ONLY, QUIET
from dist_sgd.course.skeleton import skeleton

STATE = ".progress.json"


def _state(folder):
    try:
        with open(os.path.join(folder, STATE)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _save_state(folder, state):
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, STATE + ".tmp")
    with open(tmp, "w") as f:
        json.dump(state, f, indent=1, sort_keys=True)
    os.replace(tmp, os.path.join(folder, STATE))


def status(folder, exercise, state=None):
    state = _state(folder) if state is None else state
    if not os.path.exists(os.path.join(folder, exercise.filename)):
        return "not started"
    return "passing" if state.get(exercise.name, {}).get("passing") else "started"


def _shown(path):
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def cmd_list(args):
    state = _state(args.dir)
    print(f"{'lesson':6s}  {'exercise':24s}  {'state':11s}  what to write")
    for e in EXERCISES:
        print(f"{e.lesson:6s}  {e.name:24s}  {status(args.dir, e, state):11s}  {e.what}")
    print(f"\nstart one: python3 -m dist_sgd.course start NAME (your folder: {_shown(args.dir)})")
    return 0


def cmd_start(args):
    os.makedirs(args.dir, exist_ok=True)
    ignore = os.path.join(args.dir, ".gitignore")
    if not os.path.exists(ignore):  # the learner's folder never shows up in git status
        with open(ignore, "w") as f:
            f.write("# your course work: kept out of the project's git\n*\n")
    for e in select(args.exercise):
        path = os.path.join(args.dir, e.filename)
        if os.path.exists(path):
            print(f"{e.name}: already started, your work is in {_shown(path)} (left as it is)")
        else:
            with open(path, "w") as f:
                f.write(skeleton(e))
            print(f"{e.name} (lesson {e.lesson}): edit {_shown(path)}")
        print(f"    what to write: {e.what}")
        print(f"    check it:      python3 -m dist_sgd.course check {e.name}{_dir_flag(args)}")
        print(f"    a hint:        python3 -m dist_sgd.course hint {e.name}")
        print(f"    run the lesson on it: DIST_SGD_MINE={_shown(args.dir)} python3 {e.lesson_file}")
    return 0


def _dir_flag(args):
    return "" if os.path.abspath(args.dir) == os.path.abspath(_default_dir()) else \
        f" --dir {_shown(args.dir)}"


def _check_once(args, exercises):
    from dist_sgd.course.grade import report, timed_grade

    state, failed = _state(args.dir), 0
    for e in exercises:
        path = os.path.join(args.dir, e.filename)
        if not os.path.exists(path):
            print(f"{e.name}: not started (python3 -m dist_sgd.course start {e.name})")
            failed += 1
            continue
        print(f"{e.name}: grading {_shown(path)} (lesson {e.lesson})", flush=True)
        results, elapsed = timed_grade(e.name, ("switch", os.path.abspath(args.dir)))
        ok = bool(results) and all(r.ok for r in results)
        print("\n".join(report(e.name, results, elapsed)), flush=True)
        if ok:
            print(f"  {e.name} passes every check. Now run the lesson on it: "
                  f"DIST_SGD_MINE={_shown(args.dir)} python3 {e.lesson_file}")
        failed += not ok
        entry = state.setdefault(e.name, {})
        entry.update(passing=ok, checked=time.strftime("%Y-%m-%d %H:%M:%S"))
        _save_state(args.dir, state)
    return 1 if failed else 0


def cmd_list_cases(exercises):
    """Each case of each exercise's grader: its title, its world sizes, what it proves."""
    from dist_sgd.course.grade import grader_of

    for e in exercises:
        grader = grader_of(e.name)
        total = sum(len(c.world_sizes or e.world_sizes) for c in grader.cases.values())
        print(f"{e.name} (lesson {e.lesson}): {len(grader.cases)} cases, {total} checks "
              "(each case at each world size)")
        for case in grader.cases.values():
            sizes = ", ".join(map(str, case.world_sizes or e.world_sizes))
            print(f"  - {case.title} (world sizes {sizes})")
            if case.proves:
                print(textwrap.indent(textwrap.fill(case.proves, 92), "      "))
    return 0


def cmd_check(args):
    exercises = select(args.exercise)
    if args.list:
        return cmd_list_cases(exercises)
    # The switch: every rank the grader spawns (and every lesson run from here) uses your file.
    os.environ[MINE] = os.path.abspath(args.dir)
    os.environ[ONLY] = ",".join(e.name for e in exercises)
    os.environ[QUIET] = "1"  # the graders' ranks: this process says whose code it grades
    code = _check_once(args, exercises)
    if not args.watch:
        return code
    paths = [os.path.join(args.dir, e.filename) for e in exercises]
    print("watching " + ", ".join(_shown(p) for p in paths) + ": re-checked on every save "
          "(Ctrl-C to stop)")
    seen = [_mtime(p) for p in paths]
    try:
        while True:
            time.sleep(0.5)
            now = [_mtime(p) for p in paths]
            if now != seen:
                seen = now
                print(f"\n--- {time.strftime('%H:%M:%S')} saved: checking again")
                code = _check_once(args, exercises)
    except KeyboardInterrupt:
        return code


def _mtime(path):
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def cmd_hint(args):
    state = _state(args.dir)
    for e in select(args.exercise):
        entry = state.setdefault(e.name, {})
        shown = min(entry.get("hints", 0) + 1, len(e.hints))
        entry["hints"] = shown
        print(f"{e.name}, hint {shown} of {len(e.hints)}: {e.hints[shown - 1]}")
        if shown < len(e.hints):
            print(f"    (again for the next: python3 -m dist_sgd.course hint {e.name})")
    _save_state(args.dir, state)
    return 0


def cmd_progress(args):
    state = _state(args.dir)
    counts = {"not started": 0, "started": 0, "passing": 0}
    print(f"{'lesson':6s}  {'exercise':24s}  {'state':11s}  {'hints':5s}  last checked")
    for e in EXERCISES:
        s = status(args.dir, e, state)
        counts[s] += 1
        entry = state.get(e.name, {})
        print(f"{e.lesson:6s}  {e.name:24s}  {s:11s}  {entry.get('hints', 0):5d}  "
              f"{entry.get('checked', '') if s != 'not started' else ''}")
    print(f"\n{counts['passing']} of {len(EXERCISES)} passing, {counts['started']} started "
          f"(your folder: {_shown(args.dir)})")
    return 0


def _default_dir():
    return os.environ.get(MINE) or os.path.join(ROOT, "mine")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m dist_sgd.course", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, fn, takes in (("list", cmd_list, False), ("start", cmd_start, True),
                            ("check", cmd_check, True), ("hint", cmd_hint, True),
                            ("progress", cmd_progress, False)):
        p = sub.add_parser(name)
        p.set_defaults(fn=fn)
        if takes:
            p.add_argument("exercise", nargs="+", help="a name, a lesson number, or all")
        p.add_argument("--dir", default=_default_dir(), help="your folder (default: mine/)")
        if name == "check":
            p.add_argument("--watch", action="store_true", help="check again on every save")
            p.add_argument("--list", action="store_true",
                           help="grade nothing: list each case and what it proves")
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
