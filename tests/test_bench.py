"""The benchmark CLI: redraws every figure from tiny CSVs, reports ratios and fits, survives a
failing measurement, and keeps --quick numbers out of figures/. No process group: fast."""
import os

import pytest

from dist_sgd import costmodel
from dist_sgd.bench import __main__ as cli
from dist_sgd.bench import atscale, common

ALPHA, BETA, GAMMA = 100e-6, 1 / 1.5e9, 1 / 10e9
SIZES = [2 ** k for k in (14, 17, 20, 23)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A figures folder with tiny CSVs of every measurement (atscale's measured for real)."""
    folder = tmp_path_factory.mktemp("figures")
    saved, common.FIGURES_DIR = common.FIGURES_DIR, str(folder)
    try:
        write_tiny_csvs()
        atscale.measure(quick=True)  # cheap: one process times a few BigNet steps; the rest is arithmetic
    finally:
        common.FIGURES_DIR = saved
    return folder


@pytest.fixture
def figures(tiny, monkeypatch):
    monkeypatch.setattr(common, "FIGURES_DIR", str(tiny))
    monkeypatch.setenv("DIST_SGD_FIGURES", str(tiny))
    return tiny


def write_tiny_csvs():
    common.write_csv("p2p", [{"bytes": n, "seconds": ALPHA + BETA * n, "min": 0.9 * (ALPHA + BETA * n),
                              "max": 1.2 * (ALPHA + BETA * n), "bandwidth_bytes_per_s": n / (ALPHA + BETA * n),
                              "repeats": 3} for n in SIZES])
    rows = []
    for p in (2, 3):
        for a in ("naive", "tree", "ring", "halving_doubling", "gloo"):
            for n in SIZES:
                # our algorithms: exactly the model; gloo: exactly twice our ring's time
                t = costmodel.predict_all_reduce("ring" if a == "gloo" else a, n, p, ALPHA, BETA, GAMMA)
                t *= 2 if a == "gloo" else 1
                rows.append({"world_size": p, "algorithm": a, "bytes": n, "seconds": t,
                             "min": 0.9 * t, "max": 1.1 * t, "n": 3,
                             "bus_bandwidth": float(costmodel.bus_bandwidth(n, p, t)),
                             "gamma": GAMMA, "check_max_diff": 0.0})
    common.write_csv("allreduce", rows)
    rows = []
    for model in ("net", "bignet"):
        for mode in ("strong", "weak"):
            for p in (1, 2, 3):
                for s in ("average_gradients", "our DDP", "torch DDP") + (("single process",) if p == 1 else ()):
                    t = 0.01 * (1 + 0.2 * p)
                    rows.append({"model": model, "mode": mode, "strategy": s, "world_size": p,
                                 "rank_batch": 8, "global_batch": 8 * p, "seconds": t, "min": 0.9 * t,
                                 "max": 1.1 * t, "n": 3, "samples_per_s": 8 * p / t,
                                 "gradient_bytes": 4000, "cores": 2, "efficiency": 0.01 / t})
    common.write_csv("scaling", rows)
    common.write_csv("breakdown", [
        {"model": m, "world_size": p, "strategy": s, "rank_batch": 8, "step": 0.03, "step_min": 0.02,
         "step_max": 0.04, "compute": 0.015, "waiting": 0.005, "communication": 0.01,
         "sync_call": 0.012, "compute_alone_slowest": 0.02}
        for m in ("net", "bignet") for p in (2, 4) for s in ("average_gradients", "our DDP", "torch DDP")])


def test_redraw_draws_every_figure_and_prints_ratios_and_fit(figures, capsys):
    names = ["p2p", "allreduce", "scaling", "breakdown", "atscale"]
    assert cli.main(["--redraw", *names]) == 0
    for name in names:
        assert os.path.getsize(figures / f"{name}.png") > 10_000, name
    out = capsys.readouterr().out
    assert "(0.50x)" in out  # our ring took half of gloo's time
    assert "our ring / gloo for >= 1 MiB: median 0.50x, worst 0.50x -> goal <= 1.00x met" in out
    # exact model data: the fit finds the parameters and predicts every size exactly
    assert "worst error for >= 1 MiB: 0% per-algorithm fit" in out
    assert "alpha = 100 us" in out  # the p2p fit, in the atscale-free p2p report too
    assert "published ~90%" in out and "published ~88%" in out


def test_atscale_predictions_follow_the_cost_model(figures):
    rows, facts = common.read_csv("atscale")
    assert "cores" in facts and "torch" in facts
    loop = [r for r in rows if r["network"].startswith("this machine")]
    assert loop, "the p2p fit (figure 2) should give a loopback network"
    for r in rows:
        if r["algorithm"] == "published":
            continue
        step, eff = costmodel.predict_step(r["compute_s"], r["nbytes"], r["workers"], r["algorithm"],
                                           r["alpha"], r["beta"], r["gamma"], overlap=bool(r["overlap"]))
        assert r["step_s"] == pytest.approx(step) and r["efficiency"] == pytest.approx(eff)
        if r["workers"] == 1:
            assert r["efficiency"] == pytest.approx(1.0)
    assert loop[0]["alpha"] == pytest.approx(ALPHA, rel=1e-6)


def test_a_failing_measurement_does_not_stop_the_others(figures, monkeypatch, capsys):
    drawn = []

    def run_one(name, quick, redraw):
        if name == "breakdown":
            raise FileNotFoundError("no breakdown.csv")
        drawn.append(name)
        return []
    monkeypatch.setattr(cli, "run_one", run_one)
    assert cli.main(["--redraw", "breakdown", "p2p"]) == 1
    out = capsys.readouterr().out
    assert "FAILED breakdown: FileNotFoundError: no breakdown.csv" in out and drawn == ["p2p"]


def test_unknown_measurement_is_a_clear_error(capsys):
    with pytest.raises(SystemExit):
        cli.main(["allreduse"])
    assert "unknown measurement" in capsys.readouterr().err


def test_quick_leaves_figures_alone(tmp_path, monkeypatch, capsys):
    committed = tmp_path / "figures"
    committed.mkdir()
    monkeypatch.setattr(common, "FIGURES_DIR", str(committed))
    monkeypatch.delenv("DIST_SGD_FIGURES", raising=False)
    used = []
    monkeypatch.setattr(cli, "run_one", lambda name, quick, redraw: used.append(
        (name, quick, redraw, common.FIGURES_DIR)) or [])
    assert cli.main(["--quick", "scaling", "p2p"]) == 0
    assert [u[:3] for u in used] == [("p2p", True, False), ("scaling", True, False)]  # CLI order
    assert all(u[3] != str(committed) and "dist_sgd_quick_figures_" in u[3] for u in used)
    assert list(committed.iterdir()) == []
