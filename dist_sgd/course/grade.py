"""How an exercise is graded: cases run inside spawned ranks, each failure one line to act on.

    grader = Grader("average_gradients")

    @grader.case("one step of the Awkward model")
    def one_step(ctx):                  # on every rank; the piece is ctx.impl, called through
        ...                             # ctx.call (its sends counted, forbidden calls refused)
        ctx.expect_close(got, expected, "fc.weight's gradient", atol=1e-12)

A failure reads: "ring_all_reduce, world size 3, rank 1, n = 10007: element 3336 is 1.25,
expected 3.75 (tolerance 1e-05)", with a hint read off the evidence. Every case runs at every
world size of its exercise, one after the other in one spawned group per size (the tests'
harness, dist_sgd.plumbing.cases); the ranks compare notes after each case and stop together
at a failure, and the rest go on in a fresh group. A deadlock (every rank asleep for
OPERATION_TIMEOUT seconds, seen by the launcher however busy the machine), a crash,
NotImplementedError or the run's deadline is a failed check naming its rank, never a hang;
after a hang, the rest of that world size is not run. What a case sees inside its rank (the
Context, the watch on torch.distributed): dist_sgd.course.context.
"""
import importlib
import json
import os
import re
import time
import types
from dataclasses import dataclass, field

from dist_sgd.course.context import (COLLECTIVES, RECEIVES, SENDS, Context, Failure,  # noqa: F401
                                     _apart, _num, _Watch, random_input, symptoms)
from dist_sgd.course.exercises import get
from dist_sgd.plumbing.cases import Cases, GroupBroke
from dist_sgd.plumbing.launch import DEFAULT_TIMEOUT, STALLED
from dist_sgd.plumbing.mine import MINE, ONLY, load_file

# Seconds every rank may sleep (wait for a message) before the grading calls it a deadlock.
OPERATION_TIMEOUT = float(os.environ.get("DIST_SGD_COURSE_TIMEOUT", 10))
CASE_DEADLINE = 3 * OPERATION_TIMEOUT  # seconds for one (case, world size), spawn included
# What a hang means, by how the piece talks (a grader picks the one that fits its exercise).
HANG_HINT = ("a rank waited for a message that never came: every rank must make the same "
             "collective calls in the same order (a rank that skips one, or makes one more, "
             "leaves the others waiting)")
PAIRED_HANG_HINT = ("a rank waited for a message that never came: each receive needs a send "
                    "from the rank it names, and each send a receive (check src and dst on "
                    "both sides); with isend/irecv, post the receive before the send it pairs "
                    "with, and wait for both")
BLOCKING_HANG_HINT = ("a rank waited for a message that never came: a blocking send waits for "
                      "its receiver, so if every rank sends first (or every rank receives "
                      "first) nobody gets through: let some ranks listen first, as lesson 02 "
                      "does: even ranks send then receive, odd ranks receive then send")
# Errors that mean the same in every exercise: {text in the error: hint}.
COMMON_ERROR_HINTS = {
    "Pair is not connected": "a rank sent to (or received from) itself: a message never goes "
                             "to your own rank; skip it, or check the src/dst arithmetic",
    "should not be the same as the rank of the current process":
        "a rank sent to (or received from) itself: a message never goes to your own rank; "
        "skip it, or check the src/dst arithmetic",
    "killed by signal 6": "a rank's process aborted inside gloo: usually a sender and its "
                          "receiver disagree on a message's size (the receive buffer must have "
                          "as many elements, of the same dtype, as the tensor sent)"}


@dataclass
class Case:
    title: str
    run: object
    world_sizes: tuple = None
    proves: str = ""


class Grader(Cases):
    """The cases of one exercise, run by the project's harness (dist_sgd.plumbing.cases) as the
    tests run theirs. forbid: torch.distributed functions the piece must not call (the
    collectives, when the exercise builds one); error_hints: {text in an error: hint};
    hang_hint: what a deadlock means for this exercise; after_case: called on every rank
    once every rank is past a case, passed or failed (what a case leaves behind goes there)."""

    def __init__(self, name, forbid=(), error_hints=None, hang_hint=HANG_HINT,
                 after_case=None):
        super().__init__()
        self.exercise = get(name)
        self.forbid, self.hang_hint = tuple(forbid), hang_hint
        self.after_case = after_case
        self.error_hints = dict(error_hints or {})
        self.cases = {}

    def __reduce__(self):  # to the ranks: found again by its module, never pickled whole
        return _grader_of, (self.exercise.grader,)

    def case(self, title, world_sizes=None, proves=None):
        """Register fn(ctx) as the case `title`; proves: what it proves, in a sentence
        (default: fn's docstring), shown by `course check --list`."""
        def register(fn):
            self.cases[title] = Case(title, fn, world_sizes,
                                     " ".join((proves or fn.__doc__ or "").split()))
            self.add(title, fn, world_sizes)
            return fn
        return register

    # the harness's hooks, inside a rank
    def prepare(self, rank, world_size, impl, patience):
        _Watch.install()
        return impl, patience

    def attempt(self, title, rank, world_size, shared):
        _Watch.traffic = False
        failure = _run_one(self, title, rank, world_size, *shared)
        return failure, None

    def clean(self, failure):
        """A failure that sent nothing (no message, no collective inside the piece) leaves no
        stray message behind: when every rank failed so, the next case may use the group."""
        return failure is not None and not _Watch.traffic and NO_ANSWER not in failure[0]

    def own_failure(self, failure):
        return failure is not None and NO_ANSWER not in failure[0]

    def finished(self, title, rank, world_size):
        if self.after_case is not None:
            self.after_case()


def _grader_of(module):
    return importlib.import_module(module).grader


def grader_of(name):
    """Exercise `name`'s Grader."""
    return _grader_of(get(name).grader)


# ---- inside a rank --------------------------------------------------------------------------

def _load(exercise, impl):
    """The piece to grade, as a namespace of the exercise's symbols. impl: ("module", None) the
    reference; ("switch", DIR) the learner's through DIST_SGD_MINE; ("file", PATH) a file; or
    the namespace itself (a test that runs a grader's case on a variant of the piece)."""
    if isinstance(impl, types.SimpleNamespace):
        return impl
    kind, where = impl
    if kind == "switch":  # before the reference module is imported: its swap_in reads these
        os.environ[MINE], os.environ[ONLY] = where, exercise.name
    if kind in ("module", "switch"):
        if exercise.source.endswith(".py"):
            module = load_file(exercise.source_path, "dist_sgd_lesson_" + exercise.lesson)
        else:
            module = importlib.import_module(exercise.source)
    elif kind == "file":
        module = load_file(where, "dist_sgd_graded_" + exercise.name)
    else:
        raise ValueError(f"impl must be module, switch or file, got {kind!r}")
    missing = [s for s in exercise.symbols if not hasattr(module, s)]
    if missing:
        raise Failure(f"{exercise.name}: the file defines no {', '.join(missing)}",
                      ["keep the names the skeleton gave you (course start writes it)"])
    return types.SimpleNamespace(**{s: getattr(module, s) for s in exercise.symbols})


def _run_one(grader, title, rank, world_size, impl, patience=OPERATION_TIMEOUT):
    """One case on this rank: None when it held, else (line, hints)."""
    where = f"{grader.exercise.name}, world size {world_size}, rank {rank}, {title}"
    try:
        ctx = Context(grader, title, rank, world_size, _load(grader.exercise, impl), patience)
        grader.cases[title].run(ctx)
    except Failure as failure:
        line = failure.line if failure.line.startswith(f"{grader.exercise.name}, world size") \
            else f"{where}: {failure.line}"
        return line, failure.hints
    except Exception:  # noqa: BLE001 - the piece's own error: reported as a failure
        import traceback
        text = traceback.format_exc()
        # A peer never answered: torch's timeout, raised here; or a peer's timeout fired first
        # and gloo closed the pair, so this rank, still waiting, reads the closed connection
        # (the deadlock's doing, not the piece's own error).
        if _no_answer(text):
            return f"{where}: {NO_ANSWER} a receive or collective timed out", [grader.hang_hint]
        return f"{where}: {_exception_line(text).split('; hint:')[0]}", _error_hints(grader, text)
    return None


def run_case(grader, title, rank, world_size, impl):
    """One case of `grader` on this rank of a running group: None when it held, else (line,
    hints). For a test that runs a grader's case on a variant of the piece: impl, a namespace
    of the exercise's symbols (or a spec, as for _load)."""
    _Watch.install()
    return _run_one(grader, title, rank, world_size, impl)


# ---- in the process that grades ---------------------------------------------------------------

@dataclass
class Result:
    """One (case, world size): ok (it passed), or its failure line and hints; hung: it never
    finished; ran: False when a hang earlier at this world size left it not run."""
    title: str
    world_size: int
    ok: bool
    line: str = ""
    hints: list = field(default_factory=list)
    hung: bool = False
    ran: bool = True


_TIMED_OUT = re.compile(r"[Tt]imed? ?out|timeout")
_PEER_GONE = re.compile(r"Connection (closed|reset) by peer")
NO_ANSWER = "no answer within the time limit:"
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Failure|Interrupt|Exit)\b.*")


def _no_answer(tb):
    """Whether a traceback's exception says a peer never answered (torch's timeout, or a pair
    gloo closed after a peer's timeout): read off the exception, never off the source lines
    the traceback quotes (a line of code that says "timeout" is no timeout)."""
    raised = _exception_line(tb)
    return bool(_TIMED_OUT.search(raised) or _PEER_GONE.search(raised))


def _exception_line(tb):
    """The last exception's first line and what follows it (a message may span lines)."""
    lines = tb.rstrip().splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if _EXCEPTION.match(lines[i]):
            return " ".join(line.strip() for line in lines[i:])[:300]
    return ""


def _error_hints(grader, text):
    """The hints for an exception, from its text: NotImplementedError, or the grader's own."""
    if "NotImplementedError" in text:
        return [f"write the part marked NotImplementedError (python3 -m dist_sgd.course hint "
                f"{grader.exercise.name})"]
    hints = dict(COMMON_ERROR_HINTS, **grader.error_hints)
    return [hint for key, hint in hints.items() if key in text][:2]


def _from_rank_error(grader, title, world_size, error):
    """A RankError (a rank raised, died or hung) as a Result naming the rank: a failure a rank
    reported in the case before the group broke (its peers waited for it) before the rest."""
    if getattr(error, "reported", None):
        line, hints = error.reported[min(error.reported)]
        return Result(title, world_size, False, line, list(hints))
    tb = error.tracebacks.get(error.rank, "") or ""
    failed = re.search(r"CaseFailed: (.*)", tb)
    if failed:  # a failure this rank reported itself, after which its peers gave up waiting
        line, hints = json.loads(failed.group(1))
        return Result(title, world_size, False, line, hints)
    text = _exception_line(tb) or str(error).splitlines()[0]
    first = str(error).splitlines()[0]
    # The ranks' notes after a case broke: a peer had timed out in it (a case that failed
    # otherwise says so through CaseFailed), so the case hung too.
    broke = "all_gather_object(everyone" in tb
    hung = "deadline" in first or broke or bool(_TIMED_OUT.search(_exception_line(tb) + first))
    if hung and "NotImplementedError" not in text:
        text = f"{NO_ANSWER} " + ("it did not finish" if "deadline" in first
                                  else "every rank waited for a message no peer sends"
                                  if STALLED in first else "a receive or collective timed out")
        hints = [grader.hang_hint]
    else:
        text, hints = text.split("; hint:")[0], _error_hints(grader, tb + "\n" + first)
    line = f"{grader.exercise.name}, world size {world_size}, rank {error.rank}, {title}: {text}"
    return Result(title, world_size, False, line[:400], hints[:2], hung)


def run_grader(name, impl, world_sizes=None, titles=None, on_result=None, timeout=None,
               stop_at_first=False, deadline=None):
    """Grade exercise `name`'s implementation `impl` (see _load): one Result per (case, world
    size), case by case in the grader's order, every world size graded, so the count is the
    same on every run. At each world size the cases run one after the other in one spawned
    group (the harness's run with stop); after a failure the rest go on in a fresh group;
    after a hang the rest of that world size are not run (Result.ran False). stop_at_first:
    end at the first failure anywhere (a test that needs only one). timeout: seconds per
    operation (default OPERATION_TIMEOUT, and then CASE_DEADLINE; else three times it), for
    a caller that grades several at once. deadline: seconds for one (case, world size), spawn
    included, instead (a caller whose short timeouts catch deadlocks, on a busy machine)."""
    operation = OPERATION_TIMEOUT if timeout is None else timeout
    case_deadline = deadline or (CASE_DEADLINE if timeout is None else 3 * timeout)
    # A deadlock is seen by watching the ranks sleep for `operation` seconds (launch's stall),
    # not by an operation's timeout, which a rank waiting for a busy peer's core would hit too:
    # torch's own timeout only backs the watch up.
    backstop = max(DEFAULT_TIMEOUT, case_deadline)
    grader = importlib.import_module(get(name).grader).grader
    sizes = tuple(world_sizes or grader.exercise.world_sizes)
    wanted = [t for t in grader.cases if titles is None or t in titles]
    found = {}
    for ws in sorted({w for t in wanted for w in (grader.cases[t].world_sizes or sizes)}):
        if world_sizes is not None and ws not in sizes:
            continue
        todo = [t for t in wanted if ws in (grader.cases[t].world_sizes or sizes)]
        while todo:
            try:
                out = grader.run(ws, todo, impl, operation, stop=True, timeout=backstop,
                                 stall=operation, deadline=case_deadline + operation * len(todo))
                ran = [_from_outcomes(name, ws, title, [o[title] for o in out])
                       for title in todo if title in out[0]]
            except GroupBroke as error:
                started = error.started
                ran = [_finished(t, ws, error.earlier.get(t)) for t in started[:-1]]
                ran.append(_from_rank_error(grader, started[-1] if started else todo[0],
                                            ws, error))
            todo = todo[len(ran):]
            if ran[-1].hung:  # the rest at this world size would wait for the same message
                ran += [Result(t, ws, False, f"{name}, world size {ws}, {t}: not run (a hang "
                               "earlier at this world size)", ran=False) for t in todo]
                todo = []
            for result in ran:
                found[(result.title, ws)] = result
                if on_result:
                    on_result(result)
                if stop_at_first and not result.ok:
                    return _in_order(found, wanted)
    return _in_order(found, wanted)


def _finished(title, ws, failures):
    """A case every rank finished before its group broke at a later one: passed, or failed
    on every rank cleanly (the group went on), with the first rank's failure."""
    if not failures:
        return Result(title, ws, True)
    line, hints = failures[min(failures)]
    return Result(title, ws, False, line, list(hints))


def _from_outcomes(name, ws, title, outcomes):
    """A case's Result from every rank's Outcome: a rank's own error over its peers' timeouts
    (they waited for it)."""
    if not outcomes[0].anywhere:
        return Result(title, ws, True)
    bad = [o.failure for o in outcomes if o.failure is not None]
    bad = next((b for b in bad if NO_ANSWER not in b[0]), bad[0] if bad else None)
    line, hints = bad or (f"{name}, world size {ws}, {title}: a rank failed", [])
    return Result(title, ws, False, line, list(hints), NO_ANSWER in line)


def _in_order(found, titles):
    """Results by case (the grader's order), then world size."""
    return [found[key] for key in sorted(found, key=lambda k: (titles.index(k[0]), k[1]))]


def report(name, results, elapsed=None):
    """The lines `course check` prints for one exercise: failures in full, passes counted,
    every (case, world size) counted as passed, failed or not run."""
    passed = sum(r.ok for r in results)
    failed = sum(not r.ok and r.ran for r in results)
    not_run = sum(not r.ran for r in results)
    timing = f" in {elapsed:.1f} s" if elapsed is not None else ""
    counts = f" ({failed} fail" + (f", {not_run} not run after a hang" if not_run else "") + ")"
    lines = [f"{name}: {passed} of {len(results)} checks pass" + (counts if failed else "")
             + timing]
    if results and all("NotImplementedError" in r.line for r in results):
        first = results[0]
        head, _, rest = first.line.partition(f", {first.title}: ")
        return lines + [f"  FAIL {head}, every case: {rest}"] + \
            ["       hint: " + h for h in first.hints]
    for r in results:
        if not r.ok and r.ran:
            lines.append("  FAIL " + r.line)
            lines += ["       hint: " + h for h in r.hints]
    skipped = [r for r in results if not r.ran]
    for size in sorted({r.world_size for r in skipped}):
        titles = [r.title for r in skipped if r.world_size == size]
        lines.append(f"  NOT RUN at world size {size} (after the hang): " + "; ".join(titles))
    return lines


def timed_grade(name, impl, **kwargs):
    start = time.monotonic()
    results = run_grader(name, impl, **kwargs)
    return results, time.monotonic() - start
