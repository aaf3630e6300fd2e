"""Shared by every test file: train on synthetic data.

dist_sgd is imported as an installed package (`pip install -e .`, the README's set-up) or from
the checkout (`python -m pytest` puts the current folder on sys.path).

Tests must not depend on what a machine happens to have (MNIST downloads, Fashion-MNIST
files), so they use the synthetic dataset unless DIST_SGD_DATASET is already set; the
data-loader tests that need real files ask for them by name and skip when they are absent.

A lesson that mostly waits (tests/lesson_runner.py's EARLY) starts with the session, when its
test is chosen, and waits beside every file's tests; its test in test_lessons collects it.
"""
import os

import pytest

os.environ.setdefault("DIST_SGD_DATASET", "synthetic")  # inherited by the spawned ranks too


def pytest_configure(config):
    """One marker per course exercise (`python3 -m pytest -m ex_ring_all_reduce`), as
    minitorch has one per task; the names come from the course's registry."""
    from dist_sgd.course.exercises import EXERCISES

    for exercise in EXERCISES:
        config.addinivalue_line("markers", f"{exercise.marker}: the course's exercise "
                                f"{exercise.name} (lesson {exercise.lesson})")


@pytest.fixture(scope="session", autouse=True)
def lessons_started_early(request):
    """Starts lesson_runner.EARLY's chosen lessons; at the end stops what was never collected
    and the runner (test_lessons and test_course fork their lessons from it too)."""
    import lesson_runner

    chosen = {item.callspec.params["name"] for item in request.session.items
              if item.module.__name__.endswith("test_lessons")
              and getattr(item, "originalname", "") == "test_lesson_runs_and_keeps_its_promises"}
    for name in sorted(chosen):
        if name[:2] in lesson_runner.EARLY:
            lesson_runner.background[name] = lesson_runner.start_lesson(name, "--world-size", "2")
    yield
    lesson_runner.close()
