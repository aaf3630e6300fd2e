"""The alpha-beta cost model: fits recover known numbers, predictions equal the formulas."""
import math

import numpy as np
import pytest

from dist_sgd import costmodel
from dist_sgd.costmodel import fit_alpha_beta, fit_all_reduce, predict_all_reduce

SIZES = [2 ** k for k in range(10, 27, 2)]  # 1 KiB .. 64 MiB


def test_fit_recovers_alpha_beta_from_exact_data():
    alpha, beta = 30e-6, 1 / 2e9  # 30 us, 2 GB/s
    seconds = [alpha + beta * n for n in SIZES]
    a, b = fit_alpha_beta(SIZES, seconds)
    assert a == pytest.approx(alpha, rel=1e-9)
    assert b == pytest.approx(beta, rel=1e-9)


def test_fit_tolerates_noise_and_weights_small_sizes():
    rng = np.random.default_rng(0)
    alpha, beta = 50e-6, 1 / 1e9
    n = np.repeat(SIZES, 5)
    seconds = (alpha + beta * n) * rng.uniform(0.95, 1.05, n.size)
    a, b = fit_alpha_beta(n, seconds)
    # Relative weighting: alpha is pinned by the small sizes, not drowned by 64 MiB.
    assert a == pytest.approx(alpha, rel=0.1)
    assert b == pytest.approx(beta, rel=0.05)


def test_fit_never_returns_negative_latency():
    n = np.array(SIZES, dtype=float)
    seconds = n / 1e9 - 5e-8  # an exact line with a negative intercept: latency unresolvable
    a, b = fit_alpha_beta(n, seconds)
    assert a == 0.0 and b == pytest.approx(1e-9, rel=0.1)


def test_fit_all_reduce_recovers_parameters_across_algorithms():
    alpha, beta, gamma = 20e-6, 1 / 3e9, 1 / 10e9
    rows = [(a, n, p) for a in ("naive", "tree", "ring", "halving_doubling")
            for p in (2, 3, 4) for n in SIZES]
    algs, ns, ps = zip(*rows)
    t = [predict_all_reduce(a, n, p, alpha, beta, gamma) for a, n, p in rows]
    a, b = fit_all_reduce(algs, ns, ps, t, gamma=gamma)
    assert a == pytest.approx(alpha, rel=1e-9) and b == pytest.approx(beta, rel=1e-9)


@pytest.mark.parametrize("p", [2, 3, 4, 5, 8, 13, 1024])
def test_predictions_match_closed_forms(p):
    al, be, ga, n = 1e-5, 1e-9, 3e-10, 1 << 20
    log = math.ceil(math.log2(p))
    q = 2 ** int(math.floor(math.log2(p)))
    extra = q != p
    expected = {
        "naive": 2 * (p - 1) * (al + n * be) + (p - 1) * n * ga,
        "tree": 2 * log * (al + n * be) + log * n * ga,
        "ring": 2 * (p - 1) * al + 2 * (p - 1) / p * n * be + (p - 1) / p * n * ga,
        "halving_doubling": 2 * math.log2(q) * al + 2 * (q - 1) / q * n * be + (q - 1) / q * n * ga
        + extra * (2 * al + 2 * n * be + n * ga),
        "parameter_server": 2 * p * (al + n * be) + p * n * ga,
    }
    for algorithm, seconds in expected.items():
        assert predict_all_reduce(algorithm, n, p, al, be, ga) == pytest.approx(seconds, rel=1e-12)
    # ring and halving-doubling move the same (optimal) bytes when p is a power of two
    if not extra:
        assert predict_all_reduce("ring", n, p, 0, be) == pytest.approx(
            predict_all_reduce("halving_doubling", n, p, 0, be))


def test_ring_beats_tree_only_for_large_messages():
    al, be = 50e-6, 1 / 1e9
    assert predict_all_reduce("ring", 1024, 16, al, be) > predict_all_reduce("tree", 1024, 16, al, be)
    assert predict_all_reduce("ring", 1 << 26, 16, al, be) < predict_all_reduce("tree", 1 << 26, 16, al, be)


def test_world_size_one_costs_nothing():
    for algorithm in costmodel.ALGORITHMS:
        assert predict_all_reduce(algorithm, 1 << 20, 1, 1e-3, 1e-6, 1e-6) == 0.0
    step, eff = costmodel.predict_step(0.1, 1 << 20, 1, "ring", 1e-3, 1e-6)
    assert step == pytest.approx(0.1) and eff == pytest.approx(1.0)


def test_vectorized_and_helpers():
    t = predict_all_reduce("ring", np.array(SIZES), 4, 1e-5, 1e-9)
    assert t.shape == (len(SIZES),) and np.all(np.diff(t) > 0)
    assert costmodel.link(10, 25) == pytest.approx((25e-6, 0.8e-9))
    assert [costmodel.human_bytes(n) for n in (8, 1536, 2 ** 26)] == ["8 B", "1.5 KiB", "64 MiB"]
    assert costmodel.bus_bandwidth(1 << 20, 2, 1e-3) == pytest.approx((1 << 20) / 1e-3)
    step, eff = costmodel.predict_step(0.2, 1e8, 64, "ring", 0, 1e-9, overlap=True)
    assert step == pytest.approx(0.2) and eff == pytest.approx(1.0)


@pytest.mark.parametrize("call, message", [
    (lambda: predict_all_reduce("butterfly", 10, 2, 0, 0), "unknown algorithm"),
    (lambda: predict_all_reduce("ring", 10, 0, 0, 0), "world_size"),
    (lambda: predict_all_reduce("ring", 10, 2.5, 0, 0), "world_size"),
    (lambda: predict_all_reduce("ring", -1, 2, 0, 0), "nbytes"),
    (lambda: predict_all_reduce("ring", 10, 2, -1e-6, 0), "alpha"),
    (lambda: fit_alpha_beta([1, 2, 3], [1.0, 2.0]), "one time per size"),
    (lambda: fit_alpha_beta([8, 8, 8], [1.0, 1.1, 0.9]), "two or more different sizes"),
    (lambda: fit_alpha_beta([8, 16], [1.0, 0.0]), "times must be"),
    (lambda: fit_alpha_beta([8, -16], [1.0, 2.0]), "sizes must be"),
    (lambda: fit_all_reduce(["ring", "ring"], [8, 16], [1, 1], [1.0, 2.0]), "world size 1"),
])
def test_bad_input_gives_clear_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()
