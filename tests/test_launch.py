"""The launcher, one property per test: results by rank for every init method, one return
convention under spawn and torchrun, failures that name the rank that caused them, and what
torch's launchers accept (a busy peer after the last collective, sys.exit(0), a value that
cannot be pickled, ...) accepted here too.

A spawn costs seconds, so each module fixture runs one launch() and several tests read it.
Run under torchrun, this file is its own subject: see test_torchrun_* and the end of the file.
"""
import datetime
import multiprocessing as mp
import os
import re
import subprocess
import sys
import tempfile
import time
import warnings

import pytest
import torch
import torch.distributed as dist

from dist_sgd.plumbing import launch as launcher
from dist_sgd.plumbing.rank import log, under_torchrun
from dist_sgd.plumbing.launch import INIT_METHODS, RankError, launch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def report(rank, world_size, tag):
    """What a rank sees of its group, and one collective through it."""
    total = torch.tensor([rank + 1.0])
    dist.all_reduce(total)
    return {"rank": rank, "tag": tag, "group_rank": dist.get_rank(),
            "group_size": dist.get_world_size(), "backend": dist.get_backend(),
            "sum": total.item(), "pid": os.getpid(), "threads": torch.get_num_threads(),
            "under_torchrun": under_torchrun()}


# ---- results by rank, for every init method -------------------------------------------------

WORLD_SIZES = {"env": 3, "tcp": 2, "file": 2}


@pytest.fixture(scope="module", params=INIT_METHODS)
def group(request):
    method = request.param
    results = launch(report, WORLD_SIZES[method], method, init_method=method)
    return {"method": method, "world_size": WORLD_SIZES[method], "results": results,
            "left_behind": mp.active_children()}


def test_results_are_indexed_by_rank(group):
    assert [r["rank"] for r in group["results"]] == list(range(group["world_size"]))
    assert [r["tag"] for r in group["results"]] == [group["method"]] * group["world_size"]


def test_each_rank_joins_one_group_of_the_world_size(group):
    assert [r["group_rank"] for r in group["results"]] == list(range(group["world_size"]))
    assert {r["group_size"] for r in group["results"]} == {group["world_size"]}
    assert {r["backend"] for r in group["results"]} == {"gloo"}


def test_all_reduce_through_the_group_sums_every_rank(group):
    n = group["world_size"]
    assert [r["sum"] for r in group["results"]] == [n * (n + 1) / 2] * n


def test_each_rank_is_its_own_process(group):
    pids = {r["pid"] for r in group["results"]}
    assert len(pids) == group["world_size"] and os.getpid() not in pids


def test_each_rank_computes_with_one_thread(group):
    assert {r["threads"] for r in group["results"]} == {1}


def test_no_process_is_left_behind(group):
    assert group["left_behind"] == []


def test_a_rank_is_not_taken_for_a_torchrun_rank(group):
    # RANK / WORLD_SIZE in a rank's environment are launch()'s: a rank that calls launch()
    # again spawns a group of its own, as under mp.spawn.
    assert {r["under_torchrun"] for r in group["results"]} == {False}


def check_report(results, init_method, world_size):
    """Every property above, for a launch of report() made elsewhere (tests/test_p2p.py)."""
    group = {"method": init_method, "world_size": world_size, "results": results,
             "left_behind": mp.active_children()}
    for test in (test_results_are_indexed_by_rank, test_each_rank_joins_one_group_of_the_world_size,
                 test_all_reduce_through_the_group_sums_every_rank, test_each_rank_is_its_own_process,
                 test_each_rank_computes_with_one_thread, test_no_process_is_left_behind,
                 test_a_rank_is_not_taken_for_a_torchrun_rank):
        test(group)


# ---- bad arguments: clear errors before anything starts -------------------------------------

@pytest.mark.parametrize("world_size", [0, -1, "2", 2.0, True, None])
def test_bad_world_size_is_a_clear_value_error(world_size):
    with pytest.raises(ValueError, match="world_size must be a positive integer"):
        launch(report, world_size, "x")


def test_unknown_init_method_is_a_value_error():
    with pytest.raises(ValueError, match="init_method must be one of"):
        launch(report, 2, "x", init_method="carrier-pigeon")
    assert mp.active_children() == []


@pytest.mark.parametrize("timeout", [0, -1, None])
def test_non_positive_timeout_is_a_value_error(timeout):
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        launch(report, 2, "x", timeout=timeout)


def test_a_function_that_cannot_be_sent_to_the_ranks_is_a_value_error():
    with pytest.raises(ValueError, match="module-level function"):
        launch(lambda rank, world_size: rank, 2)
    assert mp.active_children() == []


# ---- a rank that raises, dies or hangs ------------------------------------------------------

def fail_on_last_rank(rank, world_size, how, pid_dir):
    with open(os.path.join(pid_dir, f"rank{rank}.pid"), "w") as f:
        f.write(str(os.getpid()))
    dist.barrier()  # everyone is up: what follows is a failure in the middle of a job
    if rank == world_size - 1:
        if how == "raise":
            raise ValueError(f"boom from rank {rank}")
        if how == "exit":
            os._exit(3)
        time.sleep(600)  # "hang": alive, but never talks again
    dist.recv(torch.zeros(1), world_size - 1)  # the others wait for the failed rank
    return rank


def failed_launch(how, world_size, pid_dir, timeout):
    start = time.perf_counter()
    with pytest.raises(RankError) as info:
        launch(fail_on_last_rank, world_size, how, str(pid_dir), timeout=timeout)
    return {"error": info.value, "message": str(info.value), "pid_dir": str(pid_dir),
            "seconds": time.perf_counter() - start, "world_size": world_size}


# A long timeout for "raise" and "exit": they must be reported because they happened.
@pytest.fixture(scope="module")
def raised(tmp_path_factory):
    return failed_launch("raise", 3, tmp_path_factory.mktemp("raise"), timeout=60)


@pytest.fixture(scope="module")
def exited(tmp_path_factory):
    return failed_launch("exit", 2, tmp_path_factory.mktemp("exit"), timeout=60)


@pytest.fixture(scope="module")
def hung(tmp_path_factory):
    return failed_launch("hang", 2, tmp_path_factory.mktemp("hang"), timeout=3)


def assert_all_gone(pid_dir, world_size):
    names = os.listdir(pid_dir)
    assert len(names) == world_size, "every rank started"
    for name in names:
        pid = int(open(os.path.join(pid_dir, name)).read())
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert mp.active_children() == []


def test_a_raising_rank_is_named_with_its_exception(raised):
    assert raised["error"].rank == 2, raised["message"]
    assert raised["message"].startswith("rank 2 failed: ValueError: boom from rank 2")


def test_the_raising_ranks_traceback_is_in_the_message(raised):
    assert "--- traceback from rank 2 ---" in raised["message"]
    assert 'raise ValueError(f"boom from rank {rank}")' in raised["message"]


def test_a_dead_rank_is_named_with_its_exit_code(exited):
    assert exited["error"].rank == 1, exited["message"]
    assert exited["message"].startswith("rank 1 died without reporting a result (exit code 3)")


@pytest.mark.parametrize("case", ["raised", "exited"])
def test_a_failure_is_reported_without_waiting_for_a_timeout(case, request):
    seconds = request.getfixturevalue(case)["seconds"]
    assert seconds < 30, f"took {seconds:.1f} s, the timeout is 60 s"


@pytest.mark.parametrize("case", ["raised", "exited", "hung"])
def test_no_rank_survives_a_failure(case, request):
    failed = request.getfixturevalue(case)
    assert_all_gone(failed["pid_dir"], failed["world_size"])


def test_a_hung_rank_makes_its_peer_time_out(hung):
    assert hung["error"].rank == 0, hung["message"]  # rank 0 is the one that noticed
    assert "timed out" in hung["message"].splitlines()[0].lower(), hung["message"]
    assert 3 <= hung["seconds"] < 33, f"took {hung['seconds']:.1f} s with a 3 s timeout"


def test_a_hung_rank_is_pointed_at(hung):
    assert "still running then (now stopped): rank 1" in hung["message"], hung["message"]
    assert "probably hung" in hung["message"], hung["message"]


# ---- issue 9, bug 3: the rank whose own code raised is the cause ----------------------------

def download_fails_on_rank_0(rank, world_size):
    dist.barrier()
    if rank == 0:
        raise TimeoutError("download of the dataset timed out")  # the rank's own error
    dist.all_reduce(torch.ones(4))  # rank 1 only sees rank 0 vanish: a symptom
    return rank


@pytest.fixture(scope="module")
def own_timeout():
    with pytest.raises(RankError) as info:
        launch(download_fails_on_rank_0, 2, timeout=30)
    return info.value


def test_a_rank_whose_own_code_raised_is_blamed_not_its_peer(own_timeout):
    assert own_timeout.rank == 0, str(own_timeout)
    first = str(own_timeout).splitlines()[0]
    assert first == "rank 0 failed: TimeoutError: download of the dataset timed out", first


def test_the_blamed_ranks_traceback_is_in_the_message(own_timeout):
    message = str(own_timeout)
    tb = message[message.index("--- traceback from rank 0 ---"):]
    assert 'raise TimeoutError("download of the dataset timed out")' in tb, message


def test_every_failed_ranks_traceback_is_kept(own_timeout):
    assert set(own_timeout.tracebacks) == {0, 1}, str(own_timeout)
    assert "download_fails_on_rank_0" in own_timeout.tracebacks[0]
    assert "all_reduce" in own_timeout.tracebacks[1], own_timeout.tracebacks[1]
    assert "rank 1 also failed, probably as a consequence" in str(own_timeout)


def test_blame_prefers_own_error_then_death_then_symptom_then_arrival():
    symptom, died, own = ("symptom", "s", "tb"), ("died", "d", ""), ("error", "e", "tb")
    assert launcher._blame({1: symptom, 0: own}) == 0  # the symptom arrived first
    assert launcher._blame({2: symptom, 1: died}) == 1
    assert launcher._blame({1: symptom, 0: symptom}) == 1
    assert launcher._blame({2: own, 0: own}) == 2


def _raised(fn):
    try:
        fn()
    except BaseException as e:  # noqa: BLE001
        return e
    raise AssertionError("did not raise")


def test_an_error_is_classified_by_where_it_was_raised_not_by_its_words():
    def own():
        raise RuntimeError("connection reset by peer, timed out")  # words of a symptom

    def transport():  # a native torch.distributed call that fails: nobody listens there
        dist.TCPStore("127.0.0.1", launcher.free_port(), is_master=False,
                      timeout=datetime.timedelta(seconds=0.5))

    def misuse():  # raised inside torch.distributed, but a bad argument of this rank's own
        dist.all_reduce(torch.ones(2), op="not an op")

    assert not launcher._from_torch_distributed(_raised(own))
    assert launcher._from_torch_distributed(_raised(transport))
    assert not launcher._from_torch_distributed(_raised(misuse))


# ---- issue 9, bug 2: nothing after fn returns fails because a peer is busy ------------------

def rank_0_epilogue(rank, world_size, seconds):
    total = torch.tensor([1.0])
    dist.all_reduce(total)  # the last collective
    if rank == 0:
        time.sleep(seconds)  # evaluating, plotting, saving: longer than the timeout
    return total.item()


def test_a_rank_busy_longer_than_the_timeout_after_the_last_collective_is_no_failure():
    assert launch(rank_0_epilogue, 2, 3.5, timeout=2) == [2.0, 2.0]


# ---- issue 9: what torch's launchers accept is accepted -------------------------------------

def accepted_endings(rank, world_size):
    dist.all_reduce(torch.ones(1))
    if rank == 1:
        return (i for i in range(3))  # a generator: pickle cannot copy it
    if rank == 2:
        dist.destroy_process_group()  # the rank leaves the group itself
        return "left"
    if rank == 3:
        sys.exit(0)
    return "plain"


@pytest.fixture(scope="module")
def endings():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = launch(accepted_endings, 4)
    return results, [str(w.message) for w in caught]


def test_a_result_pickle_cannot_copy_arrives_as_none_with_a_warning(endings):
    results, caught = endings
    assert results[0] == "plain" and results[1] is None
    assert any(m.startswith("rank 1 returned a value that cannot be sent back (generator")
               for m in caught), caught


def test_a_rank_may_destroy_its_own_group(endings):
    assert endings[0][2] == "left"


def test_sys_exit_zero_in_a_rank_is_success(endings):
    assert endings[0][3] is None


def exit_quietly(rank, world_size):
    os._exit(0)


def test_a_rank_that_ends_its_process_with_exit_code_0_is_success():
    assert launch(exit_quietly, 1) == [None]


def test_leftovers_of_earlier_runs_change_nothing(monkeypatch, tmp_path):
    # What the tutorial's init_process, an earlier torchrun or a user's group leave behind.
    monkeypatch.setenv("MASTER_ADDR", "10.255.255.1")
    monkeypatch.setenv("MASTER_PORT", "1")
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("LOCAL_RANK", "5")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        results = launch(report, 2, "after")
        assert [r["sum"] for r in results] == [3.0, 3.0]
        assert dist.is_initialized() and dist.get_world_size() == 1, "our own group is untouched"
    finally:
        dist.destroy_process_group()


def test_rank_and_world_size_without_a_launchers_address_do_not_make_a_rank(monkeypatch, capsys):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "7")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    assert not under_torchrun()
    log("this process is no rank: it speaks")
    assert capsys.readouterr().out == "this process is no rank: it speaks\n"


# ---- the same convention under torchrun -----------------------------------------------------

@pytest.fixture(scope="module", autouse=True)
def torchrun_started(request):
    """torchrun and its workers mostly import torch and wait (rank 0's epilogue): started
    with this module when a test of theirs is chosen, they run beside the other tests."""
    if not any(item.module is request.module and "torchrun_output" in item.fixturenames
               for item in request.session.items):
        yield None
        return
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           os.path.abspath(__file__)]
    # Files, not pipes: nobody reads a pipe until the test, and a full one would stop torchrun.
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=err, text=True)
        yield proc, out, err
        if proc.poll() is None:  # never collected (its tests were not reached)
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def torchrun_output(torchrun_started):
    proc, out, err = torchrun_started
    try:
        proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out.seek(0)
    err.seek(0)
    stdout = out.read()
    output = stdout + err.read()
    assert proc.returncode == 0, output[-3000:]
    return dict(re.findall(r"^(rank \d launch \d): (.*)$", stdout, re.M)), output


def test_torchrun_rank_0_gets_every_ranks_result(torchrun_output):
    lines, output = torchrun_output
    assert lines.get("rank 0 launch 1") == "ranks [0, 1], sums [3.0, 3.0]", output[-3000:]


def test_torchrun_other_ranks_get_none(torchrun_output):
    lines, output = torchrun_output
    assert lines.get("rank 1 launch 1") == "None", output[-3000:]


def test_torchrun_a_second_launch_in_the_same_process_works(torchrun_output):
    lines, output = torchrun_output
    assert lines.get("rank 0 launch 2") == "[2.0, 2.0]", output[-3000:]
    assert lines.get("rank 1 launch 2") == "None", output[-3000:]


def summarize(results):
    if results is None:
        return "None"
    return f"ranks {[r['rank'] for r in results]}, sums {[r['sum'] for r in results]}"


if __name__ == "__main__":  # run by torchrun_output: every process is one rank
    here = os.environ["RANK"]
    # One write per line: print() writes the text and the newline separately, and the two
    # ranks share the output, so their lines could run together.
    sys.stdout.write(f"rank {here} launch 1: {summarize(launch(report, None, 'torchrun'))}\n")
    sys.stdout.flush()
    # The second launch needs keys of its own in torchrun's store, and rank 0's epilogue is
    # longer than the timeout: rank 1 must wait for it without failing.
    sys.stdout.write(f"rank {here} launch 2: {launch(rank_0_epilogue, None, 3.5, timeout=2)}\n")
    sys.stdout.flush()


def test_asking_a_store_whose_host_is_gone_gives_up_in_bounded_time():
    """Under torchrun a failed rank asks the launcher's store which peers had finished; when
    that store's host vanished (a lost node) the request can block for minutes."""
    import time as _time

    from dist_sgd.plumbing.launch import _finished_peers

    class Answers:
        def check(self, keys):
            return keys == ["result/2"]

    class Gone:
        def check(self, keys):
            _time.sleep(60)

    assert _finished_peers(Answers(), 0, 3) == [2]
    start = _time.monotonic()
    assert _finished_peers(Gone(), 0, 3, wait=0.5) == []
    assert _time.monotonic() - start < 5


def _spin_on_rank_1(rank, world_size):
    while rank == 1:  # pure Python: no operation's timeout ever sees this
        time.sleep(0.01)
    return rank


def test_a_rank_past_the_deadline_is_stopped_and_named():
    start = time.monotonic()
    with pytest.raises(RankError, match="rank 1 failed: did not finish before the run's "
                                        "deadline") as error:
        launch(_spin_on_rank_1, 2, deadline=3)
    assert error.value.rank == 1
    assert time.monotonic() - start < 20


def _deadlock(rank, world_size):
    dist.recv(torch.zeros(4), src=1 - rank)  # both receive first: nobody sends


def _busy_then_send(rank, world_size, seconds):
    """Rank 1 works (pure Python, on a core) for `seconds` before it sends: rank 0 waits."""
    if rank == 1:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pass
        dist.send(torch.ones(4), dst=0)
        return None
    got = torch.zeros(4)
    dist.recv(got, src=1)
    return got.tolist()


def test_a_deadlock_is_caught_by_the_ranks_sleeping_not_by_a_timeout():
    start = time.monotonic()
    with pytest.raises(RankError, match="every rank still running slept for 1.5 s"):
        launch(_deadlock, 2, timeout=120, stall=1.5)
    assert time.monotonic() - start < 30, "caught by the watch, long before torch's timeout"


def test_a_peer_that_works_longer_than_the_stall_is_no_deadlock(monkeypatch):
    # Watched, rank 0's long wait is no hang: rank 1 is on a core all along.
    assert launch(_busy_then_send, 2, 3.0, timeout=120, stall=1.0)[0] == [1.0] * 4
    # Where the ranks cannot be watched, the stall is each operation's timeout: the same wait
    # then reads as a hang (what a busy machine does to a short timeout).
    monkeypatch.setattr(launcher.watch, "available", lambda: False)
    with pytest.raises(RankError, match="rank 0 failed"):
        launch(_busy_then_send, 2, 3.0, timeout=120, stall=1.0)


def test_the_watch_tells_a_sleeping_process_from_a_working_one():
    from dist_sgd.plumbing import watch
    sleeping = subprocess.Popen(["sleep", "30"])
    working = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        asleep, busy = watch.Stall(0.5), watch.Stall(0.5)
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            seen = asleep.stalled([sleeping.pid]), busy.stalled([working.pid])
            time.sleep(0.1)
        assert seen == (True, False), seen
    finally:
        sleeping.kill()
        working.kill()


def _rank_sum(rank, world_size):
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    return t.item()


def test_a_store_port_taken_before_rank_0_binds_it_is_tried_again_on_another(monkeypatch):
    # Between the launcher's pick and rank 0's bind another process may take the port (an
    # outgoing connection, another job's store): no rank got past the rendezvous, so launch
    # starts again on a new port instead of failing.
    import socket

    from dist_sgd.plumbing import rendezvous
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    picks = iter([taken.getsockname()[1]])
    monkeypatch.setattr(launcher, "free_port",
                        lambda: next(picks, None) or rendezvous.free_port())
    try:
        assert launch(_rank_sum, 2) == [3.0, 3.0]
        assert next(picks, "used") == "used", "the taken port was tried first"
    finally:
        taken.close()


def test_the_stores_port_is_picked_below_the_kernels_ephemeral_range():
    from dist_sgd.plumbing import rendezvous
    low = rendezvous._ephemeral_low()
    if low is None:
        pytest.skip("no /proc/sys/net/ipv4/ip_local_port_range here")
    assert all(low - rendezvous.PORTS_BELOW_EPHEMERAL <= rendezvous.free_port() < low
               for _ in range(20))


@pytest.mark.parametrize("stall", [0, -2])
def test_a_non_positive_stall_is_a_value_error(stall):
    with pytest.raises(ValueError, match="stall"):
        launch(_spin_on_rank_1, 1, stall=stall)


@pytest.mark.parametrize("deadline", [0, -1, float("nan")])
def test_a_non_positive_deadline_is_a_value_error(deadline):
    with pytest.raises(ValueError, match="deadline"):
        launch(_spin_on_rank_1, 1, deadline=deadline)


# ---- the end of a rank: nothing left running into the process's end ------------------------

def _torch_in_a_thread_at_exit(rank, world_size):
    """A thread still inside torch's C++ code when the rank ends (as a gloo thread running a
    future's Python callback would be): it wants the GIL back while the process ends."""
    import threading

    def spin():
        while True:
            torch.ones(1000).sum()

    threading.Thread(target=spin, daemon=True).start()
    time.sleep(0.2)
    return rank


def test_a_rank_ends_without_teardown_even_under_spawn(monkeypatch, capfd):
    # Under "spawn" a rank used to exit through the interpreter's teardown, where a thread
    # inside torch that takes the GIL back makes the C++ runtime abort the process
    # ("terminate called without an active exception"), after its result had come back:
    # the run passed, with an abort at its end. The fork server's children never tear down.
    monkeypatch.setenv("DIST_SGD_START_METHOD", "spawn")
    assert launch(_torch_in_a_thread_at_exit, 1) == [0]
    err = capfd.readouterr().err
    assert "terminate called" not in err, err


def _slow_sum_on_the_helper_thread(rank, world_size, folder):
    """Leaves fn with an all-reduce still to come on the ordered helper thread."""
    from dist_sgd.comm.ordered import start_all_reduce

    def slow_all_reduce(tensor):
        time.sleep(0.5)  # the rank has returned from fn (and every peer too) by now
        dist.all_reduce(tensor)
        with open(os.path.join(folder, f"rank{rank}"), "w") as f:
            f.write(str(tensor.item()))

    start_all_reduce(torch.tensor([rank + 1.0]), slow_all_reduce)
    return rank


def test_work_on_the_helper_thread_finishes_before_the_rank_leaves_its_group(tmp_path):
    # Each rank returns with its all-reduce still on the helper thread: the rank must let it
    # finish (dist_sgd.comm.ordered.settle, called before leaving) instead of destroying the
    # group under it.
    assert launch(_slow_sum_on_the_helper_thread, 2, str(tmp_path)) == [0, 1]
    sums = sorted(p.read_text() for p in tmp_path.iterdir())
    assert sums == ["3.0", "3.0"], sums


# ---- the end of a process that started its ranks itself -------------------------------------
# tests/exit_trigger.py: rank 0 returns with our all-reduce in flight (its callback pending on
# torch's Future) and its process ends, under torch.multiprocessing.spawn and under torchrun;
# without the library's exit handler this aborts every time (SIGABRT).
TRIGGER = os.path.join(ROOT, "tests", "exit_trigger.py")


def _ends_normally(cmd):
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    output = proc.stdout + proc.stderr
    assert "terminate called" not in output and proc.returncode == 0, output[-3000:]
    assert proc.stdout.count("returns") == 2, output[-3000:]


def test_no_abort_at_exit_with_our_work_in_flight_under_torch_multiprocessing_spawn():
    _ends_normally([sys.executable, TRIGGER])


def test_no_abort_at_exit_with_our_work_in_flight_under_torchrun():
    _ends_normally([sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc-per-node", "2", TRIGGER])
