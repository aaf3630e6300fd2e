"""The course's graders, one test per exercise (marker ex_<name>): the reference passes them.

Each grader (dist_sgd/course/graders/<name>.py) compares the piece with torch's own on the
same inputs at world sizes 1-4. Here the piece is the reference put in the learner's place
through the same switch a learner's file uses (DIST_SGD_MINE), so this also proves the switch.
With DIST_SGD_MINE already set, the learner's own folder is graded instead:

    DIST_SGD_MINE=mine python3 -m pytest -q -m ex_average_gradients tests/test_graders.py
"""
import concurrent.futures
import os

import pytest

from dist_sgd.course import grade
from dist_sgd.course.exercises import EXERCISES
from dist_sgd.plumbing.mine import MINE
from dist_sgd.course.skeleton import reference


def each_exercise():
    return [pytest.param(e, id=e.name, marks=getattr(pytest.mark, e.marker)) for e in EXERCISES]


@pytest.fixture(scope="module")
def graded(request, tmp_path_factory):
    """run_grader for each chosen exercise, six at a time (as tests/test_course.py grades), in
    the tests' order; each test checks its own. One grading alone leaves a core idle (it waits
    on its groups' start and its ranks' notes); they share nothing but the fork server: each
    has its own groups and folder."""
    def grade_one(exercise):
        folder = os.environ.get(MINE)
        if folder is None:  # the reference, in a learner's folder
            folder = str(tmp_path_factory.mktemp(exercise.name))
            with open(os.path.join(folder, exercise.filename), "w") as f:
                f.write(reference(exercise))
        return grade.run_grader(exercise.name, ("switch", os.path.abspath(folder)))

    chosen = [item.callspec.params["exercise"] for item in request.session.items
              if item.module is request.module and getattr(item, "originalname", "") ==
              "test_grader_passes"]
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        futures = {e.name: pool.submit(grade_one, e) for e in chosen}
        yield lambda name: futures[name].result(timeout=600)  # each launch has its deadline
        for future in futures.values():
            future.cancel()


@pytest.mark.parametrize("exercise", each_exercise())
def test_grader_passes(exercise, graded):
    results = graded(exercise.name)
    assert results and all(r.ok for r in results), "\n".join(grade.report(exercise.name, results))
    tried = {(r.title, r.world_size) for r in results}
    grader_cases = __import__(exercise.grader, fromlist=["grader"]).grader.cases
    assert len(tried) == sum(len(c.world_sizes or exercise.world_sizes)
                             for c in grader_cases.values()), "a case was skipped"
