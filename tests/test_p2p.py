"""dist_sgd.comm.p2p.ping_pong and exchange_cpu: the tables they return on three ranks, a group
of one refused, and the machine's busy time they read."""
import time

import pytest
import torch.distributed as dist

from dist_sgd.plumbing.launch import launch
from dist_sgd.comm.p2p import exchange_cpu, machine_cpu_seconds, ping_pong
from test_launch import check_report, report

SIZES = [8, 4096, 2 ** 18]


def ping_pong_rows(rank, world_size):
    out = report(rank, world_size, "env")
    out["rows"] = ping_pong(SIZES, repeats=3, warmup=1)
    out["cpu"] = exchange_cpu([64, 65536], seconds=0.2, rounds=2)  # rank 2 only waits
    for bad in ([], [0], [-8], [1.5]):
        with pytest.raises(ValueError):
            ping_pong(bad)
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="rounds"):
            exchange_cpu([64], rounds=bad)
    return out


def test_ping_pong_on_three_ranks():
    results = launch(ping_pong_rows, 3, init_method="env")
    check_report(results, "env", 3)  # the launcher's env:// init, for tests/test_launch.py
    rows = results[0]["rows"]
    assert all(r["rows"] == rows for r in results), "every rank returns the same table"
    assert [r["bytes"] for r in rows] == SIZES
    for r in rows:
        assert 0 < r["min"] <= r["seconds"] <= r["max"] < 5, r
        assert r["bandwidth"] == pytest.approx(r["bytes"] / r["seconds"])
    for result in results:
        cpu = result["cpu"]
        assert [r["bytes"] for r in cpu] == [64, 65536], cpu
        for r in cpu:  # two rounds of at least 5 swaps, two messages each; their median
            rounds = r["rounds"]
            assert len(rounds) == 2 and all(s["messages"] >= 10 and s["messages"] % 2 == 0
                                            for s in rounds), r
            assert r["messages"] == sum(s["messages"] for s in rounds), r
            times = sorted(s["seconds"] for s in rounds)
            assert (r["min"], r["seconds"], r["max"]) == (times[0], sum(times) / 2, times[1]), r
        # a share of the cores: /proc/stat counts 10 ms ticks, two of them either way are 5%
        # of 0.2 s on 2 cores (a share left summed over the cores would be twice as big)
        assert all(r["seconds"] >= 0 and 0 <= r["busy"] <= 1.25 for r in cpu), cpu
    # the same number of swaps on both ranks, or one would have waited forever
    assert [r["messages"] for r in results[0]["cpu"]] == [r["messages"] for r in results[1]["cpu"]]


def test_the_machines_busy_time_grows_with_work_not_with_sleep():
    before = machine_cpu_seconds()
    end = time.perf_counter() + 0.3
    while time.perf_counter() < end:
        pass
    busy = machine_cpu_seconds() - before
    assert busy >= 0.2, busy  # a core kept busy for 0.3 s (ticks are 10 ms)


def test_one_rank_is_refused(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rendezvous", rank=0,
                            world_size=1)
    try:
        with pytest.raises(ValueError, match="at least 2 ranks"):
            ping_pong([8])
        with pytest.raises(ValueError, match="at least 2 ranks"):
            exchange_cpu([8])
    finally:
        dist.destroy_process_group()
