"""The benchmark harness: --redraw draws every figure from tiny CSVs, the reports compute the
ratios and fits from them, one failing measurement does not stop the others, a measurement
that cannot run is skipped, it writes into figures/ only when told --save-figures and says
beforehand what each part will take; and nothing but the benchmark's own tests imports it.
No process group: fast."""
import ast
import contextlib
import io
import os
import pathlib
import shutil
import sys
import types

import pytest

from dist_sgd.scale import costmodel
from dist_sgd.plumbing import figures
from dist_sgd.plumbing.figures import figure_path, read_csv, write_csv
from dist_sgd.bench import __main__ as cli
from dist_sgd.bench import atscale, common

ALPHA, BETA, GAMMA = 100e-6, 1 / 1.5e9, 1 / 10e9
SIZES = [2 ** k for k in (14, 17, 20, 23)]
STRATEGIES = ("average_gradients", "our DDP", "torch DDP")


def t_model(algorithm, n, p):
    return costmodel.predict_all_reduce(algorithm, n, p, ALPHA, BETA, GAMMA)


def write_tiny_csvs():
    """A tiny CSV for every figure, numbers chosen so the reports' results are known."""
    write_csv("p2p", [{"bytes": n, "seconds": ALPHA + BETA * n, "min": ALPHA, "max": 2 * ALPHA + BETA * n,
                              "bandwidth_bytes_per_s": n / (ALPHA + BETA * n), "repeats": 3} for n in SIZES])
    rows = []
    for p, ours in ((2, ("naive", "tree", "ring", "ring_pipelined", "halving_doubling")),
                    (3, ("naive", "tree", "ring", "halving_doubling"))):  # p=3: no ring_pipelined rows
        for a in ours + ("gloo",):
            for n in SIZES:  # ours: exactly the model; gloo: exactly twice the ring's time
                t = 2 * t_model("ring", n, p) if a == "gloo" else t_model(a, n, p)
                rows.append({"world_size": p, "algorithm": a, "bytes": n, "seconds": t, "min": 0.9 * t,
                             "max": 1.1 * t, "n": 3, "bus_bandwidth": float(costmodel.bus_bandwidth(n, p, t)),
                             "gamma": GAMMA, "check_max_diff": 0.0})
    write_csv("allreduce", rows)
    write_csv("scaling", [
        {"model": m, "mode": mode, "strategy": s, "world_size": p, "rank_batch": 8, "global_batch": 8 * p,
         "seconds": 0.01 * (1 + 0.2 * p), "min": 0.009, "max": 0.02, "n": 3, "samples_per_s": 8 * p / (0.01 * (1 + 0.2 * p)),
         "gradient_bytes": 4000, "cores": 2, "efficiency": 1 / (1 + 0.2 * p)}
        for m in ("net", "bignet") for mode in ("strong", "weak") for p in (1, 2, 3)
        for s in STRATEGIES + (("single process",) if p == 1 else ())])
    write_csv("breakdown", [
        {"model": m, "world_size": p, "strategy": s, "rank_batch": 8, "step": 0.03, "step_min": 0.02,
         "step_max": 0.04, "compute": 0.015, "waiting": 0.005, "communication": 0.01,
         "sync_call": 0.012, "compute_alone_slowest": 0.02}
        for m in ("net", "bignet") for p in (2, 4) for s in STRATEGIES])
    speed = {"single process": 20, "average_gradients": 40, "average_gradients, flat": 33,
             "per-parameter hooks": 35, "our DDP, 25 MiB": 33, "our DDP, 1 MiB": 31,
             "torch DDP, 25 MiB": 30, "torch DDP, 1 MiB": 31, "torch DDP, its defaults": 31}
    write_csv("ddp_speed", [{"world_size": 2, "strategy": k, "median_ms": v, "min_ms": v - 1,
                                    "max_ms": v + 1, "n": 3} for k, v in speed.items()])
    write_csv("bucket_sweep", [{"world_size": 2, "who": who, "bucket_cap_mb": cap, "our_buckets": b,
                                       "median_ms": 30, "min_ms": 29, "max_ms": 31, "n": 3}
                                      for cap, b in (("0", 8), ("one bucket", 1)) for who in ("our DDP", "torch DDP")])
    write_csv("ddp_timeline", [
        {"world_size": 2, "strategy": s, "what": what, "label": "x", "start_ms": 1.0, "end_ms": 2.0}
        for s in ("average_gradients, flat", "per-parameter hooks", "our DDP")
        for what in ("gradient ready", "all-reduce", "gradients synchronized")])
    ways = ("single process",) + STRATEGIES + ("our DataParallel",)
    write_csv("comparison", [
        {"strategy": s, "processes": 2, "max_grad_diff": 1e-8, "max_weight_diff_early": 1e-8,
         "max_weight_diff": 1e-3, "vs_torch_ddp": 0.0, "steps": 3, "final_loss": 1.0, "accuracy": 0.5,
         "step_ms": 10.0, "peak_mib": 500.0, "memory": "cumulative"} for s in ways])
    write_csv("comparison_loss", [{"strategy": s, "step": i, "loss": 2.0 - i / 10}
                                         for s in ways for i in range(3)])
    write_csv("atscale", atscale.all_predictions(0.04, 4.8e6))  # reads the p2p fit above
    write_csv("large_batch", [  # linear_warmup flat to 1024, the others falling off sooner
        {"recipe": r, "batch": b, "seed": seed, "test_accuracy": 88.0 - drop * (b > 64) + seed / 4,
         "steps_to_target": (400 + 60_000 // b) if r == "linear_warmup" else "",
         "target": 0.84, "b_simple": 300.0 if b > 64 else ""}
        for r, drop in (("none", 3), ("sqrt", 2), ("linear", 2), ("linear_warmup", 0),
                        ("lars", 0.5))
        for b in (32, 64, 256, 1024) for seed in (0, 1)], facts="Fashion-MNIST; tiny")
    # Part two's measurements: their committed CSVs (the numbers the README quotes) are redrawn.
    committed = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "figures")
    for name in os.listdir(committed):
        if name.startswith(("compress", "zero", "beyond")) and name.endswith(".csv"):
            shutil.copy(os.path.join(committed, name), figure_path(name))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("figures")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DIST_SGD_FIGURES", str(folder))
        write_tiny_csvs()
    return folder


@pytest.fixture
def figures_here(tiny, monkeypatch):
    monkeypatch.setenv("DIST_SGD_FIGURES", str(tiny))
    return tiny


@pytest.fixture(scope="module")
def redrawn(tiny):
    """Run `--redraw` once over every measurement; its exit code and its output."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DIST_SGD_FIGURES", str(tiny))
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = cli.main(["--redraw"])
    return code, out.getvalue()


PNGS = ["p2p", "allreduce", "scaling", "breakdown", "ddp_speed", "bucket_sweep", "ddp_timeline",
        "comparison_loss", "comparison_time", "atscale", "compress", "zero", "beyond", "beyond_ps_cost",
        "large_batch"]


def test_redraw_succeeds_for_every_measurement(redrawn):
    code, out = redrawn
    assert code == 0, out[-3000:]
    assert "FAILED" not in out


@pytest.mark.parametrize("name", PNGS)
def test_redraw_draws_each_figure_from_its_csv(redrawn, tiny, name):
    assert os.path.getsize(tiny / f"{name}.png") > 10_000, name


def test_allreduce_report_prints_every_algorithm_against_gloo(redrawn):
    out = redrawn[1]
    # gloo took twice the ring's time: ratio 0.50 for the ring, at every size
    assert "ring / gloo for >= 1 MiB: median 0.50x, worst 0.50x" in out
    # ring_pipelined rows exist at p=2 only: reported there, and p=3 still drawn without them
    assert out.count("ring_pipelined / gloo for >= 1 MiB") == 1


def test_allreduce_fit_recovers_the_model_exactly(redrawn):
    out = redrawn[1]
    assert out.count("worst error for >= 1 MiB: 0% per-algorithm fit") == 2  # p = 2 and 3


def test_allreduce_fit_survives_a_gamma_bigger_than_the_times():
    from dist_sgd.bench import allreduce
    rows = [{"world_size": 2, "algorithm": a, "bytes": n, "seconds": t_model("ring", n, 2),
             "gamma": 1.0} for a in ("ring", "gloo") for n in SIZES]  # 1 s per byte: absurd
    fit = allreduce.fits(rows)[2]
    assert fit["gamma"] == 0.0 and fit["gamma_measured"] == 1.0
    assert fit["ring"][0] > 0 and fit["ring"][1] > 0


def test_large_batch_report_gives_each_recipes_range_and_b_crit(redrawn):
    out = redrawn[1]
    assert "linear_warmup within 1 point of batch 64: batch 32-1024 (32x wide)" in out
    assert "none          within 1 point of batch 64: batch 32-64 (2x wide)" in out
    assert "B_crit = E_min / S_min = 150" in out  # S = 400 + 60000 / B: 60000 / 400


def test_p2p_report_recovers_alpha(redrawn):
    assert "alpha = 100.0 us" in redrawn[1]


def test_scaling_report_prints_every_world_size(redrawn):
    out = redrawn[1]
    table = out[out.index("net, strong scaling"):out.index("net, weak scaling")]
    assert [line.split()[0] for line in table.splitlines()[2:5]] == ["1", "2", "3"]


def test_ddp_report_gives_ours_over_torch(redrawn):
    assert "ours / torch DDP,  25 MiB buckets: 1.100" in redrawn[1]


def test_atscale_predictions_follow_the_cost_model(figures_here):
    rows, facts = read_csv("atscale")
    assert "cores" in facts and "torch" in facts
    loop = [r for r in rows if r["network"].startswith("this machine")]
    assert loop and loop[0]["alpha"] == pytest.approx(ALPHA, rel=1e-6)  # figure 2's fit
    for r in rows:
        if r["algorithm"] != "published":
            step, eff = costmodel.predict_step(r["compute_s"], r["nbytes"], r["workers"], r["algorithm"],
                                               r["alpha"], r["beta"], r["gamma"], overlap=bool(r["overlap"]))
            assert r["step_s"] == pytest.approx(step) and r["efficiency"] == pytest.approx(eff)


def test_a_failing_measurement_does_not_stop_the_others(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DIST_SGD_FIGURES", str(tmp_path))
    write_csv("p2p", [  # p2p only: breakdown.csv is missing
        {"bytes": n, "seconds": ALPHA + BETA * n, "min": ALPHA, "max": 2 * ALPHA + BETA * n,
         "bandwidth_bytes_per_s": 1.0, "repeats": 3} for n in SIZES])
    assert cli.main(["--redraw", "breakdown", "p2p"]) == 1
    out = capsys.readouterr().out
    assert "FAILED breakdown: FileNotFoundError" in out
    assert os.path.getsize(tmp_path / "p2p.png") > 10_000  # drawn after breakdown failed


@pytest.fixture
def fake_measurement(monkeypatch):
    """A module `fake` registered as the new bench modules are: measure -> rows, report, draw."""
    calls = []
    module = types.ModuleType("dist_sgd.bench.fake")
    module.measure = lambda quick=False: calls.append(("measure", quick)) or [{"x": 1}]
    module.report = lambda rows: calls.append(("report", rows))
    module.draw = lambda: calls.append(("draw",)) or []
    monkeypatch.setitem(sys.modules, "dist_sgd.bench.fake", module)
    monkeypatch.setitem(cli.MEASUREMENTS, "fake", "a test measurement")
    monkeypatch.setitem(cli.ESTIMATES, "fake", ((2, 0.5), (3, 1)))  # 3 more min as root
    return module, calls


def test_a_module_is_measured_then_reported_then_drawn(fake_measurement, tmp_path, monkeypatch):
    monkeypatch.setenv("DIST_SGD_FIGURES", str(tmp_path))
    assert cli.main(["fake"]) == 0
    assert fake_measurement[1] == [("measure", False), ("report", [{"x": 1}]), ("draw",)]


def test_a_measurement_that_cannot_run_is_skipped_with_its_reason(fake_measurement, tmp_path,
                                                                  monkeypatch, capsys):
    monkeypatch.setenv("DIST_SGD_FIGURES", str(tmp_path))

    def cannot(quick=False):
        raise common.Skip("needs 2 GPUs")
    monkeypatch.setattr(fake_measurement[0], "measure", cannot)
    assert cli.main(["fake"]) == 0
    assert "skipped fake: needs 2 GPUs" in capsys.readouterr().out


def test_unknown_measurement_is_a_clear_error(capsys):
    with pytest.raises(SystemExit):
        cli.main(["allreduse"])
    assert "unknown measurement" in capsys.readouterr().err


def test_quick_leaves_figures_alone(fake_measurement, monkeypatch, capsys):
    monkeypatch.setenv("DIST_SGD_FIGURES", "")  # unset: the committed figures/ would be used
    seen = []
    fake_measurement[0].draw = lambda: seen.append(figures.folder()) or []
    assert cli.main(["--quick", "fake"]) == 0
    assert fake_measurement[1][0] == ("measure", True)
    assert seen and "dist_sgd_quick_figures_" in seen[0]
    assert os.path.normpath(seen[0]) != os.path.normpath(figures.DEFAULT_FOLDER)


def test_a_full_run_writes_outside_the_checkout_and_says_where(fake_measurement, tmp_path,
                                                                monkeypatch, capsys):
    monkeypatch.setenv("DIST_SGD_FIGURES", "")  # unset
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    seen = []
    fake_measurement[0].draw = lambda: seen.append(figures.folder()) or []
    assert cli.main(["fake"]) == 0
    assert seen == [str(tmp_path / "dist_sgd" / "figures")]
    assert f"-> {seen[0]}" in capsys.readouterr().out


def test_save_figures_writes_into_the_checkouts_figures(fake_measurement, monkeypatch):
    monkeypatch.setenv("DIST_SGD_FIGURES", "")  # unset
    seen = []
    fake_measurement[0].draw = lambda: seen.append(figures.folder()) or []  # writes nothing
    assert cli.main(["--save-figures", "fake"]) == 0
    assert seen == [figures.DEFAULT_FOLDER]


def test_redraw_draws_the_committed_csvs_elsewhere(fake_measurement, monkeypatch):
    monkeypatch.setenv("DIST_SGD_FIGURES", "")  # unset
    seen = []
    fake_measurement[0].draw = lambda: seen.append((figures.folder(), read_csv("p2p"))) or []
    assert cli.main(["--redraw", "fake"]) == 0
    (where, (rows, facts)), = seen
    assert "dist_sgd_redrawn_" in where and where != figures.DEFAULT_FOLDER
    monkeypatch.setenv("DIST_SGD_FIGURES", figures.DEFAULT_FOLDER)
    assert (rows, facts) == read_csv("p2p")  # a copy of the committed one


def test_quick_numbers_never_go_into_the_checkouts_figures(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--quick", "--save-figures", "p2p"])
    assert "too rough for figures/" in capsys.readouterr().err


def test_the_plan_and_the_time_left_are_printed_before_each_part(fake_measurement, tmp_path,
                                                                 monkeypatch, capsys):
    monkeypatch.setenv("DIST_SGD_FIGURES", str(tmp_path))
    for root in (None, "no root (test)"):
        monkeypatch.setattr(cli, "privilege_problem", lambda: root)
        assert cli.main(["fake"]) == 0
        out = capsys.readouterr().out
        if root is None:  # its emulated nodes' 3 minutes counted
            assert "about 5 min in all" in out and "  fake        about 5 min, emulated" in out
        else:
            assert "about 2 min in all" in out and "about 2 min; its emulated nodes skipped" in out
            assert "(emulated nodes: no root (test))" in out
        assert "[1/1] fake: a test measurement (about" in out and "left" in out, out
        assert "took: fake 0 s" in out, out


def test_every_measurement_has_an_estimate():
    assert list(cli.ESTIMATES) == list(cli.MEASUREMENTS)


# ---- the lessons and the library stand without the benchmark ---------------------------------

ROOT = pathlib.Path(__file__).resolve().parent.parent


def bench_imports(path):
    """The lines of `path` that import dist_sgd.bench (or a module of it), by any spelling."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            called = ast.unparse(node.func)
            if called in ("importlib.import_module", "import_module", "__import__"):
                names = [str(node.args[0].value)]
        if any(n == "dist_sgd.bench" or n.startswith("dist_sgd.bench.") for n in names):
            found.append(node.lineno)
    return found


def test_no_lesson_or_library_module_imports_the_benchmark():
    files = sorted(ROOT.glob("lessons/*.py")) + sorted(
        p for p in ROOT.glob("dist_sgd/**/*.py") if "bench" not in p.relative_to(ROOT).parts)
    assert len(files) > 40
    offenders = {str(p.relative_to(ROOT)): lines for p in files if (lines := bench_imports(p))}
    assert offenders == {}, f"these import dist_sgd.bench (lines): {offenders}"


@pytest.mark.parametrize("source, found", [
    ("from dist_sgd.bench import nodes", [1]), ("import dist_sgd.bench.nodes as n", [1]),
    ("from dist_sgd import bench", [1]), ("x = 1\nimportlib.import_module('dist_sgd.bench.p2p')", [2]),
    ("from dist_sgd.plumbing.figures import read_csv  # the benchmark's CSVs", []),
    ("from dist_sgd.benchmarks import x", []),
])
def test_the_import_walk_finds_every_spelling(tmp_path, source, found):
    path = tmp_path / "lesson.py"
    path.write_text(source)
    assert bench_imports(path) == found


# ---- the GPU part: measured only on a GPU; here, that it refuses cleanly and draws -----------

def test_gpu_part_alone_refuses_in_one_line_without_a_gpu(capsys, monkeypatch):
    from dist_sgd.bench import gpu
    monkeypatch.setattr(gpu.torch.cuda, "is_available", lambda: False)  # also on a GPU machine
    assert cli.main(["gpu"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "no CUDA GPU" in err, (out, err)


def test_gpu_part_is_skipped_with_its_reason_in_a_run_of_every_part(monkeypatch):
    from dist_sgd.bench import gpu
    monkeypatch.setattr(gpu.torch.cuda, "is_available", lambda: False)
    with pytest.raises(common.Skip, match="no CUDA GPU"):
        gpu.measure(quick=True)


def test_gpu_part_draws_its_figure_from_a_csv_and_names_the_gpu(figures_here, capsys):
    from dist_sgd.bench import gpu
    rows = [{"part": "ddp", "what": w, "who": who, "world_size": 1, "backend": "nccl",
             "bytes": 0, "median_ms": ms, "min_ms": ms, "gpu": "Fake GPU 80GB"}
            for w in ("Net", "MLP") for who, ms in (("our DDP", 1.2), ("torch DDP", 1.0))]
    rows += [{"part": "all_reduce", "what": what, "who": who, "world_size": ws, "backend": b,
              "bytes": n, "median_ms": n / 1e6, "min_ms": n / 1e6, "gpu": "Fake GPU 80GB"}
             for what, ws, b in (("nccl, 1 rank", 1, "nccl"), ("gloo, 2 ranks", 2, "gloo"))
             for who in ("ours (ring)", "torch") for n in gpu.SIZES]
    write_csv("gpu", rows, facts="Fake GPU 80GB, torch 2.11")
    gpu.report(gpu.load())
    assert "ours / torch = 1.20x" in capsys.readouterr().out
    [png] = gpu.draw()
    assert os.path.getsize(png) > 10_000
