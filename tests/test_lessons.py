"""Every lesson runs end to end at tiny size, as a learner would start it, and keeps its promises.

A lesson states its checks in lines made by `dist_sgd.check.check`:

    <what>: max difference <d> (tolerance <t>)

Here every such line is read back and held to its tolerance, each lesson must print at least
the number of checks listed in MIN_CHECKS, and BOUNDS holds the other numbers a lesson promises
(an accuracy, a count of messages): (regex with one number group, operator, bound).
"""
import glob
import operator
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LESSONS = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "lessons", "[0-9][0-9]_*.py")))
CHECK_LINE = re.compile(r"max difference ([-+0-9.e]+|nan|inf) \(tolerance ([-+0-9.e]+)\)")
OPS = {"<=": operator.le, ">=": operator.ge, "==": operator.eq, "<": operator.lt, ">": operator.gt}

# How many check lines each lesson prints at least (at --quick, world size 2).
MIN_CHECKS = {
    "15": 2,  # sync PS and local SGD H=1 against all-reduce SGD
}
# Other numbers a lesson promises, per lesson number: (regex with one number group, op, bound).
BOUNDS = {}
# Lessons also run at an odd world size: chunks and shards that do not split evenly.
ODD_WORLD_SIZE = ("03", "04", "06", "07")


def run_lesson(name, *args, timeout=240):
    cmd = [sys.executable, os.path.join("lessons", name), "--quick", *args]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(cmd)} failed ({proc.returncode}):\n{output[-4000:]}"
    assert "Traceback" not in output, output[-4000:]
    return output


def assert_promises(name, output):
    checks = CHECK_LINE.findall(output)
    assert len(checks) >= MIN_CHECKS.get(name[:2], 1), (
        f"{name} printed {len(checks)} check lines, expected at least "
        f"{MIN_CHECKS.get(name[:2], 1)}:\n{output[-3000:]}")
    for diff, tolerance in checks:
        assert float(diff) <= float(tolerance), f"{name}: {diff} > {tolerance}"
    for pattern, op, bound in BOUNDS.get(name[:2], ()):
        found = re.findall(pattern, output)
        assert found, f"{name}: nothing matches {pattern!r}:\n{output[-3000:]}"
        for value in found:
            assert OPS[op](float(value), bound), f"{name}: {pattern!r} gave {value}, not {op} {bound}"


def test_every_lesson_is_found():
    numbers = [name[:2] for name in LESSONS]
    assert numbers == sorted(set(numbers)), f"lesson numbers repeat: {LESSONS}"
    assert numbers[:1] == ["00"], LESSONS


@pytest.mark.parametrize("name", LESSONS)
def test_lesson_runs_and_keeps_its_promises(name):
    assert_promises(name, run_lesson(name, "--world-size", "2"))


@pytest.mark.parametrize("name", [n for n in LESSONS if n[:2] in ODD_WORLD_SIZE])
def test_lesson_runs_at_an_odd_world_size(name):
    assert_promises(name, run_lesson(name, "--world-size", "3"))
