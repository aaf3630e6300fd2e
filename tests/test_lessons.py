"""Every lesson runs end to end at tiny size, as a learner would start it, and keeps its promises.

A lesson states its checks in lines made by `dist_sgd.plumbing.check.check`:

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
    "00": 2,  # x.grad of sum(2x); manual update vs torch.optim.SGD
    "01": 4,  # all-reduce through env://, tcp://, file:// groups and through launch()
    "02": 3,  # both rings against dist.all_reduce, the copied send arrived intact
    "03": 12,  # every collective (all_reduce with SUM, AVG, MAX), the barrier, random inputs
    "04": 7,  # 2(p-1) ring messages of <= ceil(n/p), every algorithm against torch
    "05": 1,  # ShardSampler vs DistributedSampler
    "06": 6,  # broadcast, (a) gradient, (b) weights, (c) ranks before/after training, (d)
    "07": 8,  # each of the three steps vs one process and vs torch DDP
    "08": 3,  # four steps by hand and DataParallel vs one process; torch's DataParallel
    "09": 8,  # 4 ways x (gradients at step 1, weights after 10 steps) vs the single process
    "10": 5,  # every all-reduce algorithm of ours vs torch's (as root: again on the network)
    "11": 7,  # 4 all-reduces vs the single-machine sum, 3 DDPs vs torch DDP
    "12": 7,  # our hooks vs torch's on the same gradients, bytes counted vs the formula
    "13": 3,  # ZeRO-1 vs plain Adam: broadcast, all_gather (ours), under our DDP
    "15": 2,  # sync PS vs all-reduce SGD, local SGD H=1 vs all-reduce SGD
}
# Other numbers a lesson promises, per lesson number: (regex with one number group, op, bound).
BOUNDS = {
    "00": [(r"test accuracy ([\d.]+)%", ">=", 20.0)],  # synthetic, --quick: 28% here
    "06": [(r"Accuracy: \d+/\d+ \(([\d.]+)%\)", ">=", 25.0)],  # synthetic, --quick: 48% here
    "07": [(r"bucket (\d+):", "<=", 2)],
    "09": [(r"after all (\d+) steps", ">=", 10)],
    "10": [(r"(\d+)% of a step computes", ">", 0)],
    "13": [(r"ZeRO-1 broadcast +[0-9.]+ KiB +([0-9.]+)x", "==", 1.5)],  # bytes, counted
}
# Lessons also run at an odd world size: chunks and shards that do not split evenly.
ODD_WORLD_SIZE = ("03", "04", "06", "07", "13")


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
