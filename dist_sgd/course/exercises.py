"""Every exercise of the course, in the order of the lessons: what the learner writes, where
the reference lives, and the hints, from gentle to nearly the answer.

An exercise's reference is the library's (or a lesson's) own code, with its region marked
(see skeleton.py); its grader is dist_sgd/course/graders/<name>.py, and the wrong versions it
is proven to reject are tests/mutants/<name>__*.py. Adding one: README.md, "Your turn".
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


EXERCISES = (
    Exercise(
        "ring_all_reduce", "04", "lessons/04_allreduce_algorithms.py", ("ring_all_reduce",),
        "sum x over every rank, in place, around a ring of isend/irecv: a reduce-scatter of p "
        "chunks, then an all-gather",
        ("Cut x into p chunks with x.tensor_split(p): views, so writing into a chunk writes x. "
         "Rank r sends to (r + 1) % p and receives from (r - 1) % p.",
         "Reduce-scatter, p - 1 steps: at step s send chunk (r - s - 1) % p to the right and add "
         "the chunk arriving from the left, (r - s - 2) % p, into yours. Then chunk r is complete.",
         "All-gather, p - 1 steps: at step s send chunk (r - s) % p (complete) and copy the "
         "arriving chunk (r - s - 1) % p into place. Each message is one chunk, never all of x.",
         "In every step post the receive first: req = dist.irecv(inbox, left); "
         "dist.send(chunk, right); req.wait(). Receive into a buffer, then add or copy it."),
        world_sizes=(1, 2, 3, 4)),
    Exercise(
        "average_gradients", "06", "dist_sgd.sgd.sync", ("average_gradients",),
        "replace every parameter's .grad by its mean over all ranks, in place (all-reduce with "
        "SUM, then divide by the world size)",
        ("model.parameters() gives each parameter once (a tied weight too); skip those whose "
         ".grad is None (frozen, or unused in this forward pass).",
         "dist.all_reduce(p.grad, op=dist.ReduceOp.SUM) leaves the sum of every rank's gradient "
         "in p.grad on every rank; the mean needs one more step.",
         "Divide by dist.get_world_size(), once: p.grad /= world_size (in place, so the "
         "optimizer sees it)."),
        world_sizes=(1, 2, 3, 4)),
    Exercise(
        "hook_ddp", "07", "dist_sgd.ddp.steps", ("HookDDP",),
        "HookDDP._grad_ready: as soon as autograd has a parameter's gradient, start averaging "
        "it over the ranks, asynchronously, and make backward() wait for every one at its end",
        ("The hook runs once per parameter, while backward is still computing the layers below: "
         "start the all-reduce and return at once (a Future), so the network works meanwhile.",
         "An average is a sum divided by p: divide param.grad by self.world_size first, then "
         "sum it in place: start_all_reduce(param.grad, self.all_reduce) returns its Future.",
         "Nothing may use the gradients before they are summed: on the first gradient of a "
         "backward (self._futures still empty) ask call_when_backward_ends to run "
         "self.finish_gradient_synchronization, which waits for every Future.",
         "if not self._futures: call_when_backward_ends(self.finish_gradient_synchronization); "
         "param.grad.div_(self.world_size); future = start_all_reduce(param.grad, "
         "self.all_reduce)"),
        world_sizes=(1, 3)),
    Exercise(
        "bucketed_ddp", "07", "dist_sgd.ddp.bucketed", ("BucketedDDP",),
        "BucketedDDP._launch_complete_buckets: start averaging every complete bucket from "
        "self._next on, strictly in bucket order, each through in_order",
        ("Every rank must issue the same all-reduces in the same order, so buckets go in index "
         "order: bucket self._next first, and only once all of it is ready (bucket.ready).",
         "One gradient can complete several buckets at once (at the end of backward the "
         "unused parameters' buckets are filled together): keep launching while the next one "
         "is complete, and stop at the last bucket.",
         "A bucket's average: self.reduce(bucket) when a communication hook is set (the "
         "gradients were copied unscaled), else _all_reduce(bucket.flat) (already times 1/p). "
         "Either goes through in_order(start, later=...), later=True for a hook; keep its "
         "Future in bucket.future.",
         "while self._next < len(self.buckets) and all(self.buckets[self._next].ready): "
         "bucket = self.buckets[self._next]; bucket.future = in_order(lambda b=bucket: "
         "self.reduce(b) if self.reduce else _all_reduce(b.flat), later=self.reduce is not "
         "None); self._next += 1"),
        world_sizes=(1, 3)),
)

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
