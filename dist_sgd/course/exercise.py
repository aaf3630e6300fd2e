"""What an exercise is: the learner's piece, where its reference, grader and lesson live.

The registry of every exercise is registry.py; looking them up, exercises.py.
"""
import os
from dataclasses import dataclass

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))  # the checkout


@dataclass(frozen=True)
class Exercise:
    name: str  # what learners search for; also the learner's file name and the pytest marker
    lesson: str  # "06": lessons/06_*.py teaches it
    source: str  # the reference: a module ("dist_sgd.sgd.sync") or a lesson ("lessons/04_...py")
    symbols: tuple  # the top-level names the learner's file defines
    what: str  # one line: what to write
    hints: tuple  # gentle -> nearly the answer
    world_sizes: tuple = (1, 2, 3, 4)

    @property
    def filename(self):
        return self.name + ".py"

    @property
    def marker(self):
        return "ex_" + self.name

    @property
    def source_path(self):
        if self.source.endswith(".py"):
            return os.path.join(ROOT, self.source)
        return os.path.join(ROOT, *self.source.split(".")) + ".py"

    @property
    def grader(self):
        return "dist_sgd.course.graders." + self.name

    @property
    def lesson_file(self):
        folder = os.path.join(ROOT, "lessons")
        names = sorted(f for f in os.listdir(folder) if f.startswith(self.lesson + "_"))
        return os.path.join("lessons", names[0]) if names else None
