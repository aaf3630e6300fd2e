"""dist_sgd.plumbing.cases, the harness the tests and the course's graders run their cases on:
every case's outcome on every rank, a grid of values, stopping together at a failure (or going
on after a clean one), and a broken group pinned on the case it was in. One group per check,
at world size 2 (each starts in well under a second once the fork server is up)."""
import os

import pytest

from dist_sgd.plumbing.cases import Cases, Checks, GroupBroke, key_of

CASES = Cases()


@CASES.case(world_sizes=[2])
def passes(rank, world_size):
    return rank * 10


@CASES.case(world_sizes=[2])
def fails_on_rank_1(rank, world_size):
    assert rank != 1, "rank 1 says no"


@CASES.case(world_sizes=[2], n=[1, 2])
def grid(rank, world_size, n):
    return n * world_size


@CASES.case(world_sizes=[2])
def two_properties(rank, world_size):
    checks = Checks(rank)
    with checks.check("holds"):
        pass
    with checks.check("fails on rank 0"):
        assert rank != 0, "not here"
    return checks


@CASES.case(world_sizes=[3])
def only_at_3(rank, world_size):
    return world_size


def test_every_case_every_rank_its_value_and_its_failure():
    found = CASES.results(2)
    assert [list(r) for r in found] == [CASES.at(2)] * 2, "every case at 2 ran, in order"
    assert "only_at_3" not in found[0] and CASES.at(3) == ["only_at_3"]
    assert [r["passes"].value for r in found] == [0, 10]
    assert [r[key_of("grid", {"n": 2})].value for r in found] == [4, 4]
    CASES.held(2, passes)
    CASES.held(2, grid, n=1)
    with pytest.raises(AssertionError, match="^rank 1: AssertionError: rank 1 says no$"):
        CASES.held(2, fails_on_rank_1)
    CASES.held(2, two_properties, part="holds")
    with pytest.raises(AssertionError, match="rank 0: AssertionError: not here"):
        CASES.held(2, two_properties, part="fails on rank 0")
    with pytest.raises(AssertionError, match="did not run"):
        CASES.held(2, grid, n=3)
    with pytest.raises(ValueError, match="registered twice"):
        CASES.case(world_sizes=[2])(passes)


class CleanFailures(Cases):
    def clean(self, failure):
        return failure is not None


def test_stop_ends_together_at_a_failure_unless_it_was_clean_everywhere():
    keys = ["passes", "fails_on_rank_1", key_of("grid", {"n": 1})]
    out = CASES.run(2, keys, stop=True, backend="gloo")
    assert [list(r) for r in out] == [keys[:2]] * 2, "both ranks stopped after the failure"
    assert out[0]["fails_on_rank_1"].failure is None and out[0]["fails_on_rank_1"].anywhere
    clean = CleanFailures()
    clean.registry = CASES.registry
    # rank 0 held, rank 1 failed cleanly: not every rank failed so, so it stops there too
    assert [list(r) for r in clean.run(2, keys, stop=True, backend="gloo")] == [keys[:2]] * 2


def dies_on_rank_1(rank, world_size):
    if rank == 1:
        os._exit(3)


def every_rank_refuses(rank, world_size):
    raise ValueError("refused before sending anything")


def test_a_clean_failure_on_every_rank_goes_on_in_the_same_group():
    clean = CleanFailures()
    clean.add("refuses", every_rank_refuses)
    clean.add("passes", passes)
    out = clean.run(2, ["refuses", "passes"], stop=True, backend="gloo")
    assert [r["passes"].value for r in out] == [0, 10]
    assert all(r["refuses"].anywhere for r in out)


def test_a_clean_failure_before_the_group_broke_is_kept_as_a_failure():
    # The course's one_f_one_b: the order case failed cleanly on every rank, the group went
    # on, and the pipeline case broke it: the order case must not read as passed.
    clean = CleanFailures()
    clean.add("passes", passes)
    clean.add("refuses", every_rank_refuses)
    clean.add("dies", dies_on_rank_1)
    with pytest.raises(GroupBroke) as error:
        clean.run(2, ["passes", "refuses", "dies"], stop=True, timeout=5, backend="gloo")
    assert error.value.started == ["passes", "refuses", "dies"]
    assert set(error.value.earlier) == {"refuses"}, error.value.earlier
    assert all("refused before sending" in f for f in error.value.earlier["refuses"].values())
    assert set(error.value.earlier["refuses"]) == {0, 1}


def test_a_broken_group_names_the_case_it_was_in():
    broken = Cases()
    broken.add("passes", passes)
    broken.add("dies", dies_on_rank_1)
    broken.add("never", passes)
    with pytest.raises(GroupBroke) as error:
        broken.run(2, stop=True, timeout=5, backend="gloo")
    assert error.value.started == ["passes", "dies"] and error.value.rank == 1
