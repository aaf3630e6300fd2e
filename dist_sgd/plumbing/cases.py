"""Many named cases inside the ranks of one spawned group: the tests' and the course's harness.

A spawn costs seconds, a case milliseconds. So the cases of a test file (or of an exercise's
grader) are registered by name, and one group per world size runs them one after the other:

    CASES = Cases()

    @CASES.case(world_sizes=[1, 2, 3], cap=[None, 0])  # once per world size and grid value
    def grads_match(rank, world_size, cap):             # runs inside every rank
        assert ...

    def test_grads_match(world_size, cap):              # in the process that tests
        CASES.held(world_size, grads_match, cap=cap)    # each failing rank's message, if any

Per case, every rank records its failure (None when it held) and the value returned; held()
reads them (a case proving several properties returns Checks). run() is the general form the
course uses: `stop` at the first failure (the ranks compare notes after each case), a progress
file naming the case a broken group was in, a stall and a deadline. A subclass changes what
runs around a case: prepare(), attempt(), clean(), finished(), own_failure().
"""
import contextlib
import functools
import itertools
import json
import os
import tempfile
from dataclasses import dataclass

import torch.distributed as dist

from dist_sgd.plumbing.launch import RankError, launch


@dataclass
class Outcome:
    """One case on one rank: failure (None when it held), value (what it returned), and
    anywhere (it failed on some rank: known when the ranks compared notes, else this rank's)."""
    failure: object = None
    value: object = None
    anywhere: bool = False


class CaseFailed(Exception):
    """Raised on a rank whose case failed while the group broke as the ranks compared notes:
    the failure as JSON, for the process that reads the tracebacks."""


class GroupBroke(RankError):
    """A RankError, and the cases that had started when it came (in order; the last one was
    running): started[:-1] finished on every rank. reported: {rank: its own failure in the
    last one}, from the ranks that got past it before the group broke (see own_failure).
    earlier: {key: {rank: failure}} for the cases of started[:-1] that failed on every rank
    cleanly (see clean()), the group going on: the others held."""

    def __init__(self, error, started, reported=None, earlier=None):
        super().__init__(error.rank, str(error), error.tracebacks)
        self.started, self.reported = started, dict(reported or {})
        self.earlier = dict(earlier or {})


def key_of(name, values=None):
    """A case's key: its name, or (name, its grid values sorted by parameter)."""
    name = getattr(name, "__name__", name)
    return (name, tuple(sorted(values.items()))) if values else name


class Checks(dict):
    """Several named properties proven in one case: `with checks.check(name): ...` records
    None, or the first failure's message, under name; the case returns the Checks, and
    held(world_size, case, part=name) reads one property."""

    def __init__(self, rank):
        super().__init__()
        self.rank = rank

    @contextlib.contextmanager
    def check(self, name):
        try:
            yield
        except Exception as error:  # noqa: BLE001 - reported by the test that reads it
            self[name] = self.get(name) or f"rank {self.rank}: {type(error).__name__}: {error}"
        else:
            self.setdefault(name, None)


class Cases:
    """Named cases, each with the world sizes it runs at. setup(rank, world_size): the values
    (a tuple) every case receives after rank and world size, made once per rank."""

    def __init__(self, setup=None):
        self.setup = setup
        self.registry = {}  # key -> (fn, world sizes or None: every size asked for)
        self._results = {}

    def __getstate__(self):
        return dict(self.__dict__, _results={})  # the ranks need the cases, not the results

    # ---- registering -----------------------------------------------------------------------

    def add(self, key, fn, world_sizes=None):
        if key in self.registry:
            raise ValueError(f"a case {key!r} is registered twice")
        self.registry[key] = (fn, None if world_sizes is None else tuple(world_sizes))

    def case(self, name=None, world_sizes=None, **grid):
        """Register fn(rank, world_size, *setup, **values) under `name` (default: fn's name),
        once per combination of grid's values (lists), at each of world_sizes."""
        def register(fn):
            for combination in itertools.product(*grid.values()):
                values = dict(zip(grid, combination))
                self.add(key_of(name or fn.__name__, values),
                         functools.partial(fn, **values) if values else fn, world_sizes)
            return fn
        return register

    def at(self, world_size):
        """The keys that run at world_size, in the order they were registered."""
        return [k for k, (_, sizes) in self.registry.items()
                if sizes is None or world_size in sizes]

    # ---- inside a rank (a subclass may change these) ---------------------------------------

    def prepare(self, rank, world_size, *args):
        """Once per rank, before its cases: what every case receives after rank, world size."""
        return tuple(self.setup(rank, world_size, *args)) if self.setup else tuple(args)

    def attempt(self, key, rank, world_size, shared):
        """One case on this rank: (None or its failure, its value)."""
        try:
            return None, self.registry[key][0](rank, world_size, *shared)
        except Exception as error:  # noqa: BLE001 - reported by the test that reads this case
            return f"rank {rank}: {type(error).__name__}: {error}", None

    def clean(self, failure):
        """Whether a failed case left the group fit for the next case (no stray message can
        be waiting): when it is so on every rank, `stop` goes on in the same group."""
        return False

    def finished(self, key, rank, world_size):
        """After each case on this rank, once the ranks compared notes (with `stop`: every rank
        is past the case, whatever happened in it): a subclass's clean-up."""

    def own_failure(self, failure):
        """Whether a failure is this rank's own (not a symptom of a peer's): said through
        CaseFailed when the group breaks as the ranks compare notes."""
        return failure is not None

    # ---- in the process that launches --------------------------------------------------------

    def run(self, world_size, keys=None, *args, stop=False, timeout=None, deadline=None,
            backend=None, stall=None):
        """Launch one group of world_size ranks running `keys` (default: every case at that
        size) in order: per rank, {key: Outcome}. stop: end at the first case that failed on
        any rank (unless it failed cleanly on every rank: see clean()). args: passed to
        prepare() on every rank. stall: seconds every rank may sleep before the group counts
        as deadlocked (see launch). A broken group (a rank raised outside a case, died, hung or
        passed the deadline) raises GroupBroke."""
        keys = self.at(world_size) if keys is None else list(keys)
        options = {"backend": backend, "deadline": deadline, "stall": stall}
        if timeout is not None:
            options["timeout"] = timeout
        with tempfile.TemporaryDirectory(prefix="dist_sgd_cases_") as folder:
            progress = os.path.join(folder, "progress")
            open(progress, "w").close()
            try:
                return launch(_run_group, world_size, self, keys, args, stop, progress,
                              **options)
            except RankError as error:
                with open(progress) as f:
                    started = [keys[int(line)] for line in f.read().split()]
                failed = _recorded(progress, world_size)
                raise GroupBroke(error, started, failed.get(len(started) - 1, {}),
                                 {keys[i]: by_rank for i, by_rank in failed.items()
                                  if i < len(started) - 1}) from None

    def results(self, world_size):
        """Every case at world_size, run once (the group is launched on the first call)."""
        if world_size not in self._results:
            self._results[world_size] = self.run(world_size, backend="gloo")
        return self._results[world_size]

    def held(self, world_size, case, part=None, **values):
        """The case's assertions held on every rank, else an AssertionError with each failing
        rank's message; part: one property of a case that returned Checks."""
        key = key_of(case, values)
        found = self.results(world_size)
        assert all(key in r for r in found), f"case {key!r} did not run at world size " \
                                             f"{world_size}"
        failures = [r[key].failure for r in found if r[key].failure is not None]
        if part is not None and not failures:
            assert all(part in r[key].value for r in found), f"{part!r} was never checked"
            failures = [r[key].value[part] for r in found if r[key].value[part] is not None]
        assert not failures, "\n".join(failures)


def _recorded(progress, world_size):
    """{case number: {rank: failure}} that ranks wrote before comparing notes, one line each."""
    found = {}
    for rank in range(world_size):
        try:
            with open(f"{progress}.{rank}") as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                i, failure = json.loads(line)
            except ValueError:  # a line cut short as the group broke
                continue
            found.setdefault(i, {})[rank] = failure
    return found


def _run_group(rank, world_size, cases, keys, args, stop, progress):
    """launch()'s fn: the cases one after the other on this rank."""
    shared = cases.prepare(rank, world_size, *args)
    out = {}
    for i, key in enumerate(keys):
        if rank == 0:
            with open(progress, "a") as f:
                f.write(f"{i}\n")
        failure, value = cases.attempt(key, rank, world_size, shared)
        anywhere, clean = failure is not None, True
        if stop and cases.own_failure(failure):  # read if the group breaks later
            with open(f"{progress}.{rank}", "a") as f:
                f.write(json.dumps([i, failure]) + "\n")
        if stop:
            everyone = [None] * world_size
            try:
                dist.all_gather_object(everyone, (failure is not None, cases.clean(failure)))
            except Exception:  # the peers' timeouts broke the group: say what happened here
                if cases.own_failure(failure):
                    raise CaseFailed(json.dumps(failure)) from None
                raise
            anywhere = any(failed for failed, _ in everyone)
            clean = all(ok for _, ok in everyone)
        out[key] = Outcome(failure, value, anywhere)
        cases.finished(key, rank, world_size)
        if stop and anywhere and not clean:
            break
    if not stop:
        dist.barrier()  # a rank whose case broke off early must not leave a peer waiting alone
    return out
