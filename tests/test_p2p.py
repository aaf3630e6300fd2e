"""dist_sgd.comm.p2p.ping_pong: the table it returns on three ranks, and a group of one refused."""
import pytest
import torch.distributed as dist

from dist_sgd.plumbing.launch import launch
from dist_sgd.comm.p2p import ping_pong
from test_launch import check_report, report

SIZES = [8, 4096, 2 ** 18]


def ping_pong_rows(rank, world_size):
    out = report(rank, world_size, "env")
    out["rows"] = ping_pong(SIZES, repeats=3, warmup=1)
    for bad in ([], [0], [-8], [1.5]):
        with pytest.raises(ValueError):
            ping_pong(bad)
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


def test_one_rank_is_refused(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rendezvous", rank=0,
                            world_size=1)
    try:
        with pytest.raises(ValueError, match="at least 2 ranks"):
            ping_pong([8])
    finally:
        dist.destroy_process_group()
