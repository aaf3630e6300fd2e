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
        "ShardSampler", "05", "dist_sgd.sgd.partition", ("ShardSampler",),
        "this rank's share of the dataset's indices, index for index DistributedSampler's: "
        "one seeded order for all ranks, padded (or cut with drop_last) to a multiple of "
        "num_replicas, then every num_replicas-th index from position rank",
        ("Every rank must draw the same order without talking: seed a torch.Generator with "
         "self.seed + self.epoch (set_epoch changes the epoch) and take torch.randperm(n, "
         "generator=g).tolist(); with shuffle=False the order is 0, 1, ..., n - 1.",
         "The length first: every rank gets the same count, math.ceil(n / num_replicas) (or "
         "n // num_replicas with drop_last), so total_size = num_samples * num_replicas.",
         "Without drop_last pad the order to total_size by repeating it from its start "
         "(order + order[:padding], over and over when n < num_replicas); with drop_last cut "
         "it: order[:total_size].",
         "A strided split, not blocks: rank r takes order[r:total_size:num_replicas] "
         "(positions r, r + R, r + 2R, ...), and __iter__ returns iter() of that list."),
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
        "SGD", "06", "dist_sgd.sgd.optim", ("SGD",),
        "torch.optim.SGD's update of each parameter, in place: maximize, weight decay, "
        "momentum (with dampening), Nesterov, the step; a parameter whose .grad is None is "
        "skipped",
        ("Work on a new tensor g, never on p.grad itself: g = -p.grad with maximize, else "
         "p.grad; weight decay then adds the L2 penalty's gradient, g = g.add(p, "
         "alpha=weight_decay). Skip p when p.grad is None.",
         "Momentum (mu) lives in self.state[p][\"momentum_buffer\"]. On p's first step the "
         "buffer is a copy of g (g.clone(): no dampening, no zeros); later b.mul_(mu).add_(g, "
         "alpha=1 - tau), tau the dampening.",
         "The direction to step: g + mu * b with nesterov, b without it, and g itself when "
         "mu is 0.",
         "Last, in place: p.add_(g, alpha=-lr). torch's order: maximize, weight decay, "
         "momentum, nesterov, step."),
        world_sizes=(1,)),
    Exercise(
        "LocalSGD", "15", "dist_sgd.beyond.local_sgd", ("average_parameters", "LocalSGD"),
        "the weights averaged over the ranks every `period` steps, on torch's "
        "PeriodicModelAverager's schedule: average_parameters(params), and LocalSGD.step's "
        "rule (warm-up first)",
        ("Average the parameters, not the gradients: after optimizer.step() each rank's copy "
         "has moved on its own; they must all become their mean, in place.",
         "average_parameters: one all-reduce of a flat copy does it: flat = flatten(params); "
         "dist.all_reduce(flat); flat /= world_size; copy_back(flat, params).",
         "The schedule counts step() calls from 0: call number c averages when c >= "
         "warmup_steps and (c - warmup_steps) % period == 0, so the first call after the "
         "warm-up averages, then every period-th.",
         "step(): due = that test; if due: self.sync() (it calls your average_parameters and "
         "counts self.syncs); self.counter += 1; return due."),
        world_sizes=(1, 2, 3, 4)),
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
