"""Smoke test: every lesson runs end to end at tiny size, as a learner would start it."""
import glob
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LESSONS = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "lessons", "[0-9][0-9]_*.py")))


def run_lesson(name, *args):
    cmd = [sys.executable, os.path.join("lessons", name), "--quick", *args]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(cmd)} failed ({proc.returncode}):\n{output[-4000:]}"
    assert "Traceback" not in output, output[-4000:]
    return output


def test_every_lesson_is_found():
    numbers = [name[:2] for name in LESSONS]
    assert numbers == sorted(set(numbers)), f"lesson numbers repeat: {LESSONS}"
    assert numbers[:1] == ["00"], LESSONS


@pytest.mark.parametrize("name", LESSONS)
def test_lesson_runs(name):
    output = run_lesson(name, "--world-size", "2")
    # Every lesson checks itself against torch and prints the max difference.
    assert "max" in output.lower() and "diff" in output.lower(), output[-2000:]


@pytest.mark.parametrize("name", [n for n in LESSONS if n[:2] in ("03", "04", "06", "07")])
def test_lesson_runs_at_an_odd_world_size(name):
    # 3 ranks: chunks and shards that do not split evenly, a ring that is not a pair.
    output = run_lesson(name, "--world-size", "3")
    assert "max" in output.lower() and "diff" in output.lower(), output[-2000:]
