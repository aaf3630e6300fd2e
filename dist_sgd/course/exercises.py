"""The course's exercises in the order of the lessons, and finding them by name or lesson.

    EXERCISES            every exercise (registry.py's entries, sorted by lesson)
    get(name)            one exercise, or a KeyError listing the names
    select(words)        those named by words: a name, a lesson number ("06", "6"), or "all"

What an exercise is (its fields, where its files are): exercise.py.
"""
from dist_sgd.course.exercise import ROOT, Exercise  # noqa: F401 - here too, as before
from dist_sgd.course.registry import ENTRIES

EXERCISES = tuple(sorted(ENTRIES, key=lambda e: e.lesson))

_BY_NAME = {e.name: e for e in EXERCISES}


def get(name):
    """The exercise called `name` (KeyError listing the names otherwise)."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"no exercise {name!r}; the exercises: {', '.join(_BY_NAME)}") from None


def select(words):
    """Exercises named by words: a name, a lesson number ("06", "6"), or "all"."""
    chosen = []
    for word in words:
        if word == "all":
            found = list(EXERCISES)
        elif word in _BY_NAME:
            found = [_BY_NAME[word]]
        else:
            number = word.zfill(2) if word.isdigit() else word
            found = [e for e in EXERCISES if e.lesson == number]
        if not found:
            raise SystemExit(f"no exercise {word!r}: give a name or a lesson number "
                             f"(`python3 -m dist_sgd.course list` shows them)")
        chosen += [e for e in found if e not in chosen]
    return chosen
