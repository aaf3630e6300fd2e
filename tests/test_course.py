"""The course command and its proofs: every skeleton fails every case of its grader, every wrong
version in tests/mutants/ is rejected by the case meant to catch it (with a line naming a rank),
every independent right version passes, and a learner's folder works end to end.

The graders themselves pass the reference through the switch in tests/test_graders.py.
"""
import ast
import concurrent.futures
import glob
import importlib
import os
import subprocess
import sys

import pytest

from dist_sgd.course import grade
from dist_sgd.course.__main__ import main as course_main
from dist_sgd.course.exercises import EXERCISES, ROOT, get, select
from dist_sgd.plumbing.mine import MINE, ONLY, QUIET, load_file
from dist_sgd.course.skeleton import reference, skeleton
from lesson_runner import run_lesson

MUTANTS = sorted(glob.glob(os.path.join(ROOT, "tests", "mutants", "*__*.py")))
WRONG = [m for m in MUTANTS if "__right_" not in m]
RIGHT = [m for m in MUTANTS if "__right_" in m]


def exercise_of(path):
    return get(os.path.basename(path).split("__")[0])


def declared(path, name, default=None):
    """A constant the mutant file sets at its top level (CAUGHT_BY, HINT, PATCH)."""
    tree = ast.parse(open(path).read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == name:
            return ast.literal_eval(node.value)
    return default


def caught_by(path):
    title = declared(path, "CAUGHT_BY")
    assert title is not None, f"{path} names no CAUGHT_BY case"
    return title


def hints_declared(path):
    """HINT: the text (or texts) of the hint its failure must carry: the hint for its symptom.
    A wrong version that declares none must get no hint another one declares."""
    hint = declared(path, "HINT", ())
    return (hint,) if isinstance(hint, str) else tuple(hint)


DECLARED = {h for m in WRONG for h in hints_declared(m)}


def learner_file(path, folder):
    """A wrong version as a complete learner's file: the file itself, or, for one written as
    PATCH (changes to the reference: (old, new), old found once), the reference so changed."""
    tree = ast.parse(open(path).read())
    patch = next((ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                  and n.targets[0].id == "PATCH"), None)
    if patch is None:
        return path
    text = reference(exercise_of(path))
    for old, new in patch:
        assert text.count(old) == 1, f"{os.path.basename(path)}: {old[:60]!r} is not in the " \
                                     "reference once (the reference changed: update the patch)"
        text = text.replace(old, new)
    out = os.path.join(folder, os.path.basename(path))
    with open(out, "w") as f:
        f.write(text)
    return out


def cases(exercise):
    return importlib.import_module(exercise.grader).grader.cases


# Gradings mostly wait (a group's start, the ranks' notes, a deadlock's timeout): six at a time
# took 80 s for this file and tests/test_graders.py on 2 cores where three took 98 s (ten: 76 s).
GRADINGS_AT_ONCE = 6

# A wrong version that deadlocks costs the operation timeout (every rank asleep that long):
# short here. A busy machine does not shorten it (the launcher watches the ranks sleep, not
# the clock), but a case's whole run, its group's start included, takes longer there: a
# deadline of its own.
QUICK_TIMEOUT = 3.0
QUICK_DEADLINE = 30.0


@pytest.fixture
def quick_timeouts(monkeypatch):
    monkeypatch.setattr(grade, "OPERATION_TIMEOUT", QUICK_TIMEOUT)
    monkeypatch.setattr(grade, "CASE_DEADLINE", 3 * QUICK_TIMEOUT)


GRADED = ("test_the_untouched_skeleton_fails_every_case",
          "test_each_wrong_version_is_rejected_by_its_case",
          "test_each_independent_right_version_passes")


class Gradings:
    """run_grader for each chosen skeleton, wrong and right version, GRADINGS_AT_ONCE at a
    time, in the tests' order; each test checks its own. One grading alone leaves a core idle
    (it waits on its groups' start, its ranks' notes, a deadlock's timeout); they share nothing
    but the fork server: each has its own groups, files, ports and timeouts (passed, not
    global)."""

    def __init__(self, jobs, folder):
        self.pool = concurrent.futures.ThreadPoolExecutor(GRADINGS_AT_ONCE)
        self.futures = {key: self.pool.submit(self.grade, key, folder) for key in jobs}

    @staticmethod
    def grade(key, folder):
        kind, name = key
        if kind == "skeleton":
            exercise = get(name)
            path = os.path.join(folder, "skeleton", exercise.filename)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(skeleton(exercise))
            return grade.run_grader(name, ("file", path), timeout=QUICK_TIMEOUT,
                                    deadline=QUICK_DEADLINE)
        exercise, path = exercise_of(name), learner_file(name, folder)
        if kind == "wrong":
            return grade.run_grader(exercise.name, ("file", path), titles=[caught_by(name)],
                                    timeout=QUICK_TIMEOUT, stop_at_first=True,
                                    deadline=QUICK_DEADLINE)
        return grade.run_grader(exercise.name, ("file", path), timeout=grade.OPERATION_TIMEOUT)

    def results(self, kind, name):
        return self.futures[kind, name].result(timeout=600)  # each launch has its deadline

    def close(self):
        self.pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(scope="module")
def gradings(request, tmp_path_factory):
    """Started by the first test that asks; done before the tests after them (the command's
    `check` below changes this process's environment, which spawned ranks inherit)."""
    kinds = dict(zip(GRADED, ("skeleton", "wrong", "right")))
    jobs = []
    for item in request.session.items:
        if item.module is request.module and getattr(item, "originalname", "") in kinds:
            param = item.callspec.params
            jobs.append((kinds[item.originalname],
                         param["exercise"].name if "exercise" in param else param["path"]))
    pool = Gradings(jobs, str(tmp_path_factory.mktemp("graded")))
    yield pool
    pool.close()


def by_exercise(paths):
    return [pytest.param(p, id=os.path.basename(p)[:-3],
                         marks=getattr(pytest.mark, exercise_of(p).marker)) for p in paths]


def each_exercise():
    return [pytest.param(e, id=e.name, marks=getattr(pytest.mark, e.marker)) for e in EXERCISES]


# ---- the registry, the skeletons, the wrong versions -------------------------------------------

def test_the_course_has_at_least_twelve_exercises_along_the_lessons():
    assert len(EXERCISES) >= 12, [e.name for e in EXERCISES]
    assert len({e.name for e in EXERCISES}) == len(EXERCISES)
    assert [e.lesson for e in EXERCISES] == sorted(e.lesson for e in EXERCISES)


@pytest.mark.parametrize("exercise", each_exercise())
def test_the_skeleton_keeps_names_and_blanks_every_region(exercise):
    text = skeleton(exercise)
    tree = ast.parse(text)  # it compiles
    top = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    assert set(exercise.symbols) <= top
    assert f"hint {exercise.name}" in text and "NotImplementedError" in text
    assert "---- exercise" not in text and "---- end of exercise" not in text
    ast.parse(reference(exercise))
    assert "NotImplementedError(" not in reference(exercise).replace(
        "NotImplementedError(\"", "")  # the reference's own raises may stay, none of ours
    assert len(exercise.hints) >= 3, "hints from gentle to nearly the answer"
    wrong = [m for m in WRONG if exercise_of(m) == exercise]
    assert len(wrong) >= 2, f"{exercise.name}: at least two wrong versions in tests/mutants/"
    for m in wrong:
        assert caught_by(m) in cases(exercise), (m, caught_by(m), list(cases(exercise)))
    with open(exercise.source_path) as f:
        source = f.read()
    calls = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call)
             and getattr(n.func, "id", "") == "swap_in" and len(n.args) >= 3
             and ast.literal_eval(n.args[1]) == exercise.name]
    assert len(calls) == 1, "the switch at the module's end, naming what it replaces"
    offered = ast.literal_eval(calls[0].args[2])
    lesson = {k.arg: ast.literal_eval(k.value) for k in calls[0].keywords}.get("lesson")
    assert (tuple(offered), lesson) == (exercise.symbols, exercise.lesson), \
        "the module and the registry name the same symbols and lesson"
    if exercise.lesson_file:
        with open(os.path.join(ROOT, exercise.lesson_file)) as f:
            assert f"course start {exercise.name}" in f.read(), "the lesson's exercises name it"


@pytest.mark.parametrize("exercise", each_exercise())
def test_every_helper_a_skeleton_uses_says_what_it_does(exercise):
    """A learner reads what the skeleton imports (or carries over) to use it: each function
    and class there has a docstring."""
    import inspect
    undocumented = []
    for node in ast.parse(skeleton(exercise)).body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dist_sgd"):
            module = importlib.import_module(node.module)
            for alias in node.names:
                obj = getattr(module, alias.name)
                if (inspect.isfunction(obj) or inspect.isclass(obj)) and \
                        not (obj.__doc__ or "").strip():
                    undocumented.append(f"{node.module}.{alias.name}")
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)) and \
                node.name not in exercise.symbols and not ast.get_docstring(node):
            undocumented.append(node.name)
    assert not undocumented, f"no docstring: {undocumented}"


@pytest.mark.parametrize("exercise", each_exercise())
def test_the_untouched_skeleton_fails_every_case(exercise, gradings):
    results = gradings.results("skeleton", exercise.name)
    assert {r.title for r in results} == set(cases(exercise)), "every case ran"
    passed = [r.title for r in results if r.ok]
    assert not passed, f"the skeleton passes {passed}"
    assert all("NotImplementedError" in r.line and "rank" in r.line for r in results)


@pytest.mark.parametrize("path", by_exercise(WRONG))
def test_each_wrong_version_is_rejected_by_its_case(path, tmp_path, gradings):
    exercise, title, mutant = exercise_of(path), caught_by(path), path
    path = learner_file(path, str(tmp_path))
    module = load_file(path, "dist_sgd_mutant_" + os.path.basename(path)[:-3])  # it imports:
    assert all(hasattr(module, s) for s in exercise.symbols)  # rejected for its mistake only
    results = gradings.results("wrong", mutant)  # run_grader(..., titles=[title])
    failed = [r for r in results if not r.ok]
    assert failed, f"{os.path.basename(path)} passes '{title}' at every world size"
    line, shown = failed[0].line, failed[0].hints
    assert f"{exercise.name}, world size" in line and ", rank " in line and title in line, line
    assert len(shown) <= 2
    # A hint is the hint: the one for its symptom fires, none meant for another mistake does.
    mine = hints_declared(mutant)
    for hint in mine:
        assert any(hint in h for h in shown), f"its hint ({hint!r}) did not fire: {line} {shown}"
    for h in shown:
        others = [d for d in DECLARED if d in h]
        assert not others or any(d in h for d in mine), \
            f"a hint meant for another mistake ({others[0]!r}) fired on this one: {line} {shown}"


@pytest.mark.parametrize("path", by_exercise(RIGHT))
def test_each_independent_right_version_passes(path, gradings):
    exercise = exercise_of(path)
    results = gradings.results("right", path)
    assert results and all(r.ok for r in results), "\n".join(grade.report(exercise.name, results))


def test_a_failure_line_names_the_element_got_expected_and_the_tolerance(quick_timeouts):
    path = os.path.join(ROOT, "tests", "mutants", "average_gradients__not_divided.py")
    results = grade.run_grader("average_gradients", ("file", path), titles=[caught_by(path)])
    # Every world size is graded: right at 1 (nothing to divide), wrong at 2, 3 and 4.
    assert [(r.world_size, r.ok) for r in results] == [(1, True), (2, False), (3, False),
                                                        (4, False)], results
    line, hints = results[1].line, results[1].hints
    assert "world size 2, rank 0" in line and "element [0, 0] is" in line, line
    assert "expected" in line and ", a difference of " in line, line
    assert "(tolerance 1e-12" in line, line
    assert hints == ["the result is p = 2 times too big: summed but not divided by the world "
                     "size"], hints
    assert grade.report("average_gradients", results)[0].startswith(
        "average_gradients: 1 of 4 checks pass (3 fail)")


def _strings(node):
    """The texts a string expression can make: literals, f-strings ({} for each value), "a" +
    ("b" if c else "c")."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        return ["".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return [a + b for a in _strings(node.left) for b in _strings(node.right)]
    if isinstance(node, ast.IfExp):
        return _strings(node.body) + _strings(node.orelse)
    return ["{}"]


def _hint_texts():
    """Every string the graders, grade.py and context.py can write."""
    texts = []
    course = os.path.join(ROOT, "dist_sgd", "course")
    for path in [os.path.join(course, "grade.py"), os.path.join(course, "context.py")] + \
            glob.glob(os.path.join(ROOT, "dist_sgd", "course", "graders", "*.py")):
        for node in ast.walk(ast.parse(open(path).read())):
            texts += _strings(node)
    return texts


def test_each_declared_hint_is_a_graders_hint():
    texts = _hint_texts()
    stale = [(os.path.basename(m), h) for m in WRONG for h in hints_declared(m)
             if not any(h in t for t in texts)]
    assert not stale, f"HINT names no hint a grader gives: {stale}"


def test_a_timeout_is_read_off_the_exception_not_the_code_the_traceback_quotes():
    quoted = ('Traceback (most recent call last):\n  File "mine.py", line 3, in f\n'
              '    work.wait(timeout=datetime.timedelta(seconds=3))\n')
    assert not grade._no_answer(quoted + "ValueError: chunk 2 has 4 elements, expected 5\n")
    assert grade._no_answer(quoted + "RuntimeError: [../gloo/transport/tcp/unbound_buffer.cc:81] "
                                     "Timed out waiting 3000ms for recv operation to complete\n")
    assert grade._no_answer(quoted + "RuntimeError: Connection closed by peer [127.0.0.1]:1\n")


def test_numbers_are_shown_with_the_digits_that_tell_them_apart():
    assert grade._apart(1.5409960001, 1.5409960002) == ("1.5409960001", "1.5409960002")
    assert grade._apart(0.25, 0.75) == ("0.25", "0.75")
    assert grade._apart(1.0, 1.0 + 2 ** -52) == ("1", "1.0000000000000002")


def test_a_deadlock_is_a_failed_check_naming_a_rank_not_a_hang(quick_timeouts):
    path = os.path.join(ROOT, "tests", "mutants", "ring_all_reduce__receive_first.py")
    results = grade.run_grader("ring_all_reduce", ("file", path), world_sizes=(2,))
    assert len(results) == len(cases(get("ring_all_reduce"))), "every case counted"
    assert results[0].hung and not any(r.ok for r in results), results
    assert all(not r.ran for r in results[1:]), "after a hang the rest of that size: not run"
    assert "no answer within the time limit" in results[0].line and "rank" in results[0].line
    assert results[0].hints == [grade.PAIRED_HANG_HINT]
    lines = grade.report("ring_all_reduce", results)
    assert lines[0].startswith(f"ring_all_reduce: 0 of {len(results)} checks pass (1 fail, "
                               f"{len(results) - 1} not run after a hang)"), lines
    assert any(line.startswith("  NOT RUN at world size 2") for line in lines), lines


def test_a_ranks_own_error_while_its_peer_waits_for_it_is_that_error_not_a_hang(tmp_path):
    # Rank 0 fails before sending; rank 1 waits for it until the grading sees every rank
    # asleep: the report is rank 0's error, with the rest of that world size still graded.
    impl = tmp_path / "gives_up.py"
    impl.write_text("import torch.distributed as dist\n\n\ndef ring_all_reduce(x):\n"
                    "    if dist.get_rank() == 0:\n"
                    "        raise ValueError('chunk 1 has 3 elements, expected 4')\n"
                    "    dist.recv(x.clone(), src=0)\n")
    results = grade.run_grader("ring_all_reduce", ("file", str(impl)), world_sizes=(2,),
                               timeout=QUICK_TIMEOUT)
    first = results[0]
    assert not first.ok and not first.hung, first
    assert "world size 2, rank 0" in first.line, first.line
    assert "ValueError: chunk 1 has 3 elements, expected 4" in first.line, first.line
    assert all(r.ran for r in results), "no hang: every case was graded"


def test_a_peer_that_gave_up_waiting_is_a_hang_not_the_pieces_error(tmp_path):
    # In a deadlock the first rank's timeout makes gloo close the pair: a peer still waiting
    # reads "Connection closed by peer" (measured: 2 s and 6 s timeouts on two ranks), which
    # must read as the hang it is, with the hang's hint, however the timeouts race.
    import torch.distributed as dist
    impl = tmp_path / "closed.py"
    impl.write_text("def ring_all_reduce(x):\n    raise RuntimeError('[gloo/transport/tcp/pair.cc"
                    ":561] Connection closed by peer [127.0.0.1]:1. This is typically caused "
                    "by a remote worker crashing.')\n")
    grader = importlib.import_module(get("ring_all_reduce").grader).grader
    title = next(iter(grader.cases))
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        line, hints = grade._run_one(grader, title, 0, 1, ("file", str(impl)))
    finally:
        dist.destroy_process_group()
    assert grade.NO_ANSWER in line and "rank 0" in line, line
    assert hints == [grader.hang_hint], hints


def test_select_takes_names_lesson_numbers_and_all():
    assert [e.name for e in select(["ring_all_reduce"])] == ["ring_all_reduce"]
    assert select(["4"]) == select(["04"]) == [e for e in EXERCISES if e.lesson == "04"]
    assert select(["all"]) == list(EXERCISES)
    with pytest.raises(SystemExit, match="no exercise 'nope'"):
        select(["nope"])


# ---- the command, as a learner runs it -------------------------------------------------------

def course(*args, env=None):
    return subprocess.run([sys.executable, "-m", "dist_sgd.course", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, **(env or {})))


def test_start_check_fails_then_passes_once_written_and_start_never_overwrites(
        tmp_path, monkeypatch, capsys, request):
    if any(i.module is request.module and getattr(i, "originalname", "") in GRADED
           for i in request.session.items):
        request.getfixturevalue("gradings").close()  # none in flight: see gradings
    folder = str(tmp_path / "mine")
    started = course("start", "04", "--dir", folder)
    assert started.returncode == 0, started.stderr
    mine = os.path.join(folder, "ring_all_reduce.py")
    assert "ring_all_reduce.py" in started.stdout and os.path.exists(mine)
    assert open(os.path.join(folder, ".gitignore")).read().strip().endswith("*")
    # The unsolved check runs the command's main() here (its spawns start in milliseconds
    # from this process's fork server); the solved one below goes through `python3 -m`.
    # check sets the switch's variables in its own process: here they are put back after
    # (setenv first: delenv of an unset variable would record nothing to put back).
    for name in (MINE, ONLY, QUIET):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    assert course_main(["check", "04", "--dir", folder]) == 1
    unsolved = capsys.readouterr().out
    assert "NotImplementedError" in unsolved and "rank 0" in unsolved, unsolved
    with open(mine, "w") as f:  # the learner writes the ring (here: an independent one)
        f.write(open(os.path.join(ROOT, "tests", "mutants",
                                  "ring_all_reduce__right_send_recv.py")).read())
    again = course("start", "ring_all_reduce", "--dir", folder)
    assert "already started" in again.stdout
    assert "bounds" in open(mine).read(), "start overwrote the learner's work"
    solved = course("check", "ring_all_reduce", "--dir", folder)
    assert solved.returncode == 0, solved.stdout + solved.stderr
    assert "16 of 16 checks pass" in solved.stdout, solved.stdout
    progress = course("progress", "--dir", folder)
    assert "ring_all_reduce           passing" in progress.stdout, progress.stdout
    first, second = (course("hint", "04", "--dir", folder).stdout for _ in range(2))
    assert "hint 1 of" in first and "hint 2 of" in second


@pytest.mark.parametrize("exercise", each_exercise())
def test_every_case_says_what_it_proves(exercise):
    """check --list shows it: the case's docstring (or its proves= text)."""
    bare = [c.title for c in cases(exercise).values() if len(c.proves.split()) < 5]
    assert not bare, f"cases with no docstring saying what they prove: {bare}"


def test_check_list_shows_what_is_checked_without_grading(capsys):
    assert course_main(["check", "--list", "06"]) == 0
    out = capsys.readouterr().out
    flat = " ".join(out.split())
    for exercise in select(["06"]):
        graded = cases(exercise).values()
        total = sum(len(c.world_sizes or exercise.world_sizes) for c in graded)
        assert f"{exercise.name} (lesson 06): {len(graded)} cases, {total} checks" in out, out
        for case in graded:
            assert f"- {case.title} (world sizes " in out, (case.title, out)
            assert " ".join(case.proves.split()) in flat, (case.proves, out)
    assert "grading" not in out


def test_the_switch_runs_a_lesson_on_the_learners_code(tmp_path):
    (tmp_path / "average_gradients.py").write_text(open(os.path.join(
        ROOT, "tests", "mutants", "average_gradients__right_tutorial.py")).read())
    # Lesson 05 trains with average_gradients too, in a shorter run than lesson 06's (which
    # test_lessons runs end to end on the library's own). It runs as `python lessons/05...`
    # would, forked from tests/lesson_runner.py (its own process and fork server, neither
    # having imported the switch's module before DIST_SGD_MINE is set); the command's fresh
    # interpreter is proven by `course check` above.
    output = run_lesson("05_partitioning.py", "--world-size", "2", timeout=300,
                        env={MINE: str(tmp_path)})
    using = [line for line in output.splitlines() if "using average_gradients from" in line]
    assert len(using) >= 2, output[-2000:]  # the parent and every spawned rank, once each
    assert len(using) == len(set(using)), "a process said it more than once"
    assert "max difference" in output
