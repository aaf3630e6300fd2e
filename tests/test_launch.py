"""The launcher: results by rank, every init method, and failures that name the failed rank.

Each test is one launch() (a spawn costs a few seconds on 2 cores), so each checks several
things at once.
"""
import multiprocessing as mp
import os
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist

from dist_sgd.launch import INIT_METHODS, RankError, launch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def report(rank, world_size, tag):
    """What a rank sees of its group, and one collective through it."""
    total = torch.tensor([rank + 1.0])
    dist.all_reduce(total)
    return {"rank": rank, "tag": tag, "group_rank": dist.get_rank(),
            "group_size": dist.get_world_size(), "backend": dist.get_backend(),
            "sum": total.item(), "pid": os.getpid(), "threads": torch.get_num_threads()}


# env:// (launch's default) is checked the same way by tests/test_p2p.py's launch, which
# calls report() too: one spawn fewer.
@pytest.mark.parametrize("init_method,world_size", [("tcp", 2), ("file", 3)])
def test_each_init_method_returns_results_by_rank(init_method, world_size):
    check_report(launch(report, world_size, init_method, init_method=init_method),
                 init_method, world_size)


def check_report(results, init_method, world_size):
    assert [r["rank"] for r in results] == list(range(world_size))
    assert [r["group_rank"] for r in results] == list(range(world_size))
    assert {r["group_size"] for r in results} == {world_size}
    assert {r["tag"] for r in results} == {init_method}
    assert {r["backend"] for r in results} == {"gloo"}
    assert {r["sum"] for r in results} == {world_size * (world_size + 1) / 2}
    assert {r["threads"] for r in results} == {1}
    assert len({r["pid"] for r in results}) == world_size, "each rank is its own process"
    assert mp.active_children() == [], "launch() left processes behind"
    assert set(INIT_METHODS) == {"env", "tcp", "file"}


@pytest.mark.parametrize("world_size", [0, -1, "2", 2.0, True, None])
def test_bad_world_size_is_a_clear_value_error(world_size):
    with pytest.raises(ValueError, match="world_size must be a positive integer"):
        launch(report, world_size, "x")


def test_bad_init_method_and_timeout_are_value_errors():
    with pytest.raises(ValueError, match="init_method"):
        launch(report, 2, "x", init_method="carrier-pigeon")
    with pytest.raises(ValueError, match="timeout"):
        launch(report, 2, "x", timeout=0)
    assert mp.active_children() == []


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


def assert_all_gone(pid_dir):
    for name in os.listdir(pid_dir):
        pid = int(open(os.path.join(pid_dir, name)).read())
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert mp.active_children() == []


@pytest.mark.parametrize("how,world_size", [("raise", 3), ("exit", 2)])
def test_a_failed_rank_is_named_fast(how, world_size, tmp_path):
    start = time.perf_counter()
    with pytest.raises(RankError) as info:
        # A long timeout: the failure must be reported because it happened, not by a timeout.
        launch(fail_on_last_rank, world_size, how, str(tmp_path), timeout=60)
    seconds = time.perf_counter() - start
    last = world_size - 1
    assert info.value.rank == last, str(info.value)
    assert str(info.value).startswith(f"rank {last} ")
    if how == "raise":
        assert f"ValueError: boom from rank {last}" in str(info.value)
        assert "fail_on_last_rank" in str(info.value), "the rank's traceback is included"
    else:
        assert "exit code 3" in str(info.value)
    assert seconds < 30, f"took {seconds:.1f} s to report a failure"
    assert len(os.listdir(tmp_path)) == world_size
    assert_all_gone(tmp_path)


def test_a_hung_rank_makes_its_peers_time_out(tmp_path):
    start = time.perf_counter()
    with pytest.raises(RankError) as info:
        launch(fail_on_last_rank, 2, "hang", str(tmp_path), timeout=5)
    seconds = time.perf_counter() - start
    message = str(info.value)
    assert info.value.rank == 0, message  # rank 0 is the one that noticed
    assert "timed out" in message.lower(), message
    assert "rank 1" in message, f"the message should point at the silent rank:\n{message}"
    assert 5 <= seconds < 35, f"took {seconds:.1f} s"
    assert_all_gone(tmp_path)


def test_lesson_01_runs_under_torchrun():
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           os.path.join("lessons", "01_process_groups.py"), "--quick"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert "[rank 0]" in output and "[rank 1]" in output, output[-3000:]
    assert "under torchrun" in output, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
