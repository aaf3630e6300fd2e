"""dist_sgd.p2p: ring_shift (blocking and not) against torch's all_reduce, and ping_pong."""
import pytest
import torch
import torch.distributed as dist

from dist_sgd.launch import launch
from dist_sgd.p2p import ping_pong, ring_shift
from test_launch import check_report, report

SIZES = [8, 4096, 2 ** 18]


def ring_and_ping_pong(rank, world_size):
    out = report(rank, world_size, "env")
    for blocking in (True, False):
        for dtype in (torch.float32, torch.int64):
            mine = torch.arange(5, dtype=dtype) * (rank + 1) + rank
            got = ring_shift(mine, blocking=blocking)
            left = (rank - 1) % world_size
            expected_left = torch.arange(5, dtype=dtype) * (left + 1) + left
            assert torch.equal(got, expected_left), (blocking, dtype, got)
            # N-1 shifts, summing: every rank ends with the sum over ranks = all_reduce's.
            total, travelling = mine.clone(), mine
            for _ in range(world_size - 1):
                travelling = ring_shift(travelling, blocking=blocking)
                total += travelling
            reference = mine.clone()
            dist.all_reduce(reference)
            torch.testing.assert_close(total, reference)
    out["rows"] = ping_pong(SIZES, repeats=3, warmup=1)
    for bad in ([], [0], [-8], [1.5]):
        with pytest.raises(ValueError):
            ping_pong(bad)
    return out


def test_ring_shift_and_ping_pong_on_three_ranks():
    results = launch(ring_and_ping_pong, 3, init_method="env")
    check_report(results, "env", 3)  # the launcher's env:// init, for tests/test_launch.py
    rows = results[0]["rows"]
    assert all(r["rows"] == rows for r in results), "every rank returns the same table"
    assert [r["bytes"] for r in rows] == SIZES
    for r in rows:
        assert 0 < r["min"] <= r["seconds"] <= r["max"] < 5, r
        assert r["bandwidth"] == pytest.approx(r["bytes"] / r["seconds"])


def test_one_rank(tmp_path):
    """A group of one: ring_shift is a copy, ping_pong refuses clearly."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rendezvous", rank=0,
                            world_size=1)
    try:
        t = torch.arange(3.0)
        for blocking in (True, False):
            got = ring_shift(t, blocking=blocking)
            assert torch.equal(got, t) and got.data_ptr() != t.data_ptr()
        with pytest.raises(ValueError, match="at least 2 ranks"):
            ping_pong([8])
    finally:
        dist.destroy_process_group()
