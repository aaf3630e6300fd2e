"""The network benchmarks (bench/netscale, nettrain, netaccuracy, nodes) and the summaries of
their CSVs that lesson 10 quotes (dist_sgd.plumbing.figures): what they compute from known
data, their figures, and (as root) one run inside emulated nodes.

Reports and figures are checked from rows made with known numbers (no root, no timing); the
node parts of netscale (world size 3: every algorithm against the single-machine sum) and of
netaccuracy (on the data a machine without any falls back to) run over loopback; the
cluster-backed test skips without root, as tests/test_cluster.py.
"""
import os

import pytest

from dist_sgd.bench import netaccuracy, netscale, nettrain, nodes
from dist_sgd.plumbing.figures import read_csv, write_csv
from dist_sgd.plumbing.launch import launch
from dist_sgd.scale import cluster, costmodel, netns
from dist_sgd.scale.summaries import (MODEL_OF, NETACCURACY_TARGET, cpu_share, crossover_words,
                                      netaccuracy_summary, netscale_summary, netscale_with_model,
                                      nettrain_efficiency)
from dist_sgd.sgd import data

KiB, MiB = 2 ** 10, 2 ** 20
ALPHA, BETA = 300e-6, 8 / 96e6  # 300 us, 96 Mbit/s
PROBLEM = netns.privilege_problem()


@pytest.fixture
def figures(tmp_path, monkeypatch):
    monkeypatch.setenv("DIST_SGD_FIGURES", str(tmp_path))  # never figures/ of the checkout
    return tmp_path


# ---- the links (their fit: tests/test_costmodel.py) ---------------------------------------

def test_tcp_goodput_of_a_link():
    assert cluster.link_goodput(100e6) == pytest.approx(12.5e6 * 1448 / 1514)


# ---- netscale ---------------------------------------------------------------------------

CPU = (250e-6, 2e-9, 2)  # 250 us + 2 ns per byte per message, 2 cores


def _netscale_rows(factor, cpu=None):
    """Ping-pong on the line; every all-reduce = the model x factor[algorithm]; with cpu, the
    2-node cluster's CPU per message on its line and the all-reduces from the model with it."""
    rows = [{"part": "ping-pong", "nodes": 2, "algorithm": "one way", "bytes": n,
             "seconds": ALPHA + BETA * n, "min": 0, "max": 0, "max_diff": ""}
            for n in costmodel.shaped_link_sizes()]
    if cpu:
        rows += [{"part": "cpu", "nodes": 2, "algorithm": "exchange", "bytes": n,
                  "seconds": cpu[0] + cpu[1] * n, "min": "", "max": "", "max_diff": "",
                  "cores": cpu[2]} for n in (64, 64 * KiB, MiB)]
    for p in (2, 4, 8, 16):
        for n in (4 * KiB, 64 * KiB, MiB, 4 * MiB):
            for a in netscale.ALGORITHMS:
                if not netscale.timed(a, n, p):
                    continue
                t = costmodel.predict_all_reduce(MODEL_OF.get(a, a), n, p, ALPHA, BETA, cpu=cpu)
                # the given factor at 16 nodes, half as far from 1 elsewhere: one worst point
                f = factor[a] if p == 16 else 1 + (factor[a] - 1) / 2
                t *= f if n >= MiB else 1.0
                rows.append({"part": "all-reduce", "nodes": p, "algorithm": a, "bytes": n,
                             "seconds": t, "min": 0.9 * t, "max": 1.1 * t, "max_diff": 1e-7})
    return netscale_with_model(rows)


FACTORS = {"gloo": 1.0, "ring": 1.04, "halving_doubling": 1.08, "tree": 1.15, "naive": 0.9}


def test_netscale_model_errors_bus_bandwidth_and_ratio_from_known_rows():
    s = netscale_summary(_netscale_rows(FACTORS))
    assert s["cpu"] is None  # no CPU rows: both models are the link alone
    for m in ("model", "model_link"):
        for a, f in FACTORS.items():  # |model / measured - 1|, the worst over every >= 1 MiB point
            assert s["error"][m][a][0] == pytest.approx(abs(1 / f - 1), rel=1e-6), a
            assert f == 1.0 or s["error"][m][a][1][1] == 16, s["error"][m][a]  # at 16 nodes
    assert s["ring/gloo"] == pytest.approx(1.04)
    # gloo on the model's ring: the lowest bus bandwidth is at 16 nodes and 1 MiB (most alphas)
    t = costmodel.predict_all_reduce("ring", MiB, 16, ALPHA, BETA)
    bus = costmodel.bus_bandwidth(MiB, 16, t) / (cluster.parse_rate(cluster.SCALING_RATE) / 8)
    assert s["bus"]["gloo"] == pytest.approx(bus)


def test_netscale_model_with_the_cpu_rows_is_the_one_errors_are_taken_against():
    rows = _netscale_rows(FACTORS, cpu=CPU)
    s = netscale_summary(rows)
    assert s["cpu"] == pytest.approx(CPU)  # refitted from the CPU rows
    for a, f in FACTORS.items():
        assert s["error"]["model"][a][0] == pytest.approx(abs(1 / f - 1), rel=1e-6), a
    for r in rows:
        if r["part"] == "all-reduce":  # the CPU's turns only add; with a core per rank, nothing
            assert r["model"] >= r["model_link"] * (1 - 1e-12)
            if r["nodes"] == 2 and r["bytes"] >= 64 * KiB:
                assert r["model"] == pytest.approx(r["model_link"])
    # 16 ranks on 2 cores: at 4 KiB the ring's 30 steps are the CPU's (30 x 8 x 250 us)
    ring = next(r for r in rows if r["part"] == "all-reduce" and r["algorithm"] == "ring"
                and r["nodes"] == 16 and r["bytes"] == 4 * KiB)
    assert ring["model"] == pytest.approx(30 * 8 * (CPU[0] + CPU[1] * 4 * KiB / 16))
    assert ring["model"] > 5 * ring["model_link"]


@pytest.mark.parametrize("cpu", [None, CPU])
def test_netscale_finds_where_the_ring_overtakes_tree_and_halving_doubling(cpu):
    s = netscale_summary(_netscale_rows(FACTORS, cpu=cpu))
    for (a, p), c in s["crossover"].items():
        low, high = c["measured"]  # the measurements are the model below 1 MiB here
        n = c["model"]
        if n is None:  # never: the other one is faster at every size measured below 1 MiB
            assert low is not None and low >= 64 * KiB, (a, p, c)
        elif n <= 1:  # at every size: the ring wins from the smallest on
            assert low is None, (a, p, c)
        else:
            assert (low is None or low < n) and (high is None or n <= high), (a, p, c)
    assert s["crossover"]["tree", 2]["model"] == 1.0  # 2 nodes: the ring sends half as much
    assert s["crossover"]["halving_doubling", 16]["model_link"] is None  # fewer alphas, same bytes
    n16 = s["crossover"]["tree", 16]["model_link"]
    assert n16 == pytest.approx(22 * ALPHA / ((8 - 1.875) * BETA), rel=0.02)  # 30a+1.875nb=8a+8nb
    # the CPU's turns cost the ring's 30 small steps most: it catches up later
    words = "between 4 KiB and 64 KiB" if cpu is None else "between 64 KiB and 1 MiB"
    assert f"measured {words}" in crossover_words(s["crossover"]["tree", 16])


def test_netscale_report_and_figure(figures, capsys):
    write_csv(netscale.NAME, _netscale_rows(FACTORS, cpu=CPU), "2 cores (test), no GPU")
    rows, _ = read_csv(netscale.NAME)
    netscale.report(rows)
    out = capsys.readouterr().out
    assert f"alpha = {ALPHA * 1e6:.0f} us, 1/beta = 96.0 Mbit/s" in out, out
    assert "CPU per message, 2 nodes swapping (every core's busy time): 250 us + 2.00 ns" in out
    assert "our ring / gloo: at most 1.040x" in out, out
    assert "halving_doubling: worst  7.4%" in out, out
    assert "ring overtakes tree             at 16 nodes: measured between" in out, out
    (png,) = netscale.draw()
    assert os.path.getsize(png) > 20_000


def _node_work_over_loopback(rank, world_size):
    netscale.CAPS[("naive", world_size)] = 64 * KiB  # a cap applies to naive only
    return netscale._node_work(rank, world_size, True)


def test_netscale_node_part_checks_and_times_every_algorithm():
    out = launch(_node_work_over_loopback, 3, backend="gloo")[0]  # 3: uneven chunks
    assert set(out["diffs"]) == set(netscale.ALGORITHMS)
    assert all(d <= 1e-5 for d in out["diffs"].values()), out["diffs"]
    sizes = netscale.settings(True)["sizes"]
    timed = {k for k in out["all-reduce"]}
    assert timed == {(a, n) for a in netscale.ALGORITHMS for n in sizes
                     if a != "naive" or n <= 64 * KiB}
    assert all(len(v) == 2 and min(v) > 0 for v in out["all-reduce"].values())
    assert [r["bytes"] for r in out["ping-pong"]] == list(netscale.settings(True)["pp"]["other"])


# ---- nettrain ---------------------------------------------------------------------------

def _nettrain_rows():
    rows = [{"part": "ping-pong", "nodes": 2, "name": "one way", "bytes": n,
             "seconds": ALPHA + BETA * n, "min": 0, "max": 0, "batch": "", "detail": ""}
            for n in costmodel.shaped_link_sizes()]
    grads, buckets = [4000, 400_000, 4_400_000, 5120], [1_100_000, 3_709_120]
    psgd = [360, 80_000, 70_000, 40, 900, 3000]  # two buckets: plain tensors, P's, Q's each
    for p in (1, 2, 4, 8):
        parts = {"compute": 0.040 * (1 + p / 4), "forward": 0.010 * (1 + p / 4),
                 "compute + PowerSGD arithmetic": 0.050 * (1 + p / 4)}
        for name, t in parts.items():
            rows.append({"part": "alone", "nodes": p, "name": name, "bytes": "", "seconds": t,
                         "min": t, "max": t, "batch": 32, "detail": ""})
        for name, detail in (("average_gradients", grads), ("our DDP", buckets),
                             ("torch DDP", buckets), ("our DDP + PowerSGD", psgd),
                             (nettrain.STRATEGIES[-1], [sum(grads)])):
            rows.append({"part": "step", "nodes": p, "name": name, "bytes": sum(detail),
                         "seconds": 0.5, "min": 0.5, "max": 0.5, "batch": 32,
                         "detail": " ".join(map(str, detail))})
    return rows


def test_nettrain_model_from_the_parts_measured_alone():
    rows = _nettrain_rows()
    pred = nettrain.predict(rows, ALPHA, BETA)

    def ring(n, p):  # the ring's cost written out: 2(p-1) messages of n/p bytes
        return 2 * (p - 1) * (ALPHA + n / p * BETA)
    for p in (1, 2, 4, 8):
        c, f, cp = 0.040 * (1 + p / 4), 0.010 * (1 + p / 4), 0.050 * (1 + p / 4)
        grads = [4000, 400_000, 4_400_000, 5120]
        assert pred["average_gradients", p] == pytest.approx(c + sum(ring(n, p) for n in grads))
        comm = ring(1_100_000, p) + ring(3_709_120, p)
        assert pred["our DDP", p] == pytest.approx(f + max(c - f, comm))  # overlap: backward
        assert pred["torch DDP", p] == pred["our DDP", p]
        # per bucket, in order: the plain tensors and the P's at once, then the Q's
        assert pred["our DDP + PowerSGD", p] == pytest.approx(
            cp + max(ring(360, p), ring(80_000, p)) + ring(70_000, p)
            + max(ring(40, p), ring(900, p)) + ring(3000, p))
        assert pred[nettrain.STRATEGIES[-1], p] == pytest.approx(c + ring(sum(grads), p) / 8)
    assert pred["our DDP", 1] == pytest.approx(0.040 * 1.25)  # one node: only compute
    assert pred["our DDP", 8] > 0.010 * 3 + 0.030 * 3  # communication longer than backward


def test_nettrain_model_with_the_cpu_share_charges_each_message_its_turns():
    rows = _nettrain_rows() + [
        {"part": "cpu", "nodes": 2, "name": "exchange", "bytes": n, "seconds": CPU[0] + CPU[1] * n,
         "min": "", "max": "", "batch": "", "detail": "", "cores": CPU[2]} for n in (64, MiB)]
    assert cpu_share(rows) == pytest.approx(CPU)
    pred, link = nettrain.predict(rows, ALPHA, BETA, CPU), nettrain.predict(rows, ALPHA, BETA)

    def ring(n, p):  # 2(p-1) steps, each the slower of its link time and p/2 turns of its CPU
        return 2 * (p - 1) * max(ALPHA + n / p * BETA, max(1, p / 2) * (CPU[0] + n / p * CPU[1]))
    cp = 0.050 * 3
    assert pred["our DDP + PowerSGD", 8] == pytest.approx(
        cp + max(ring(360, 8), ring(80_000, 8)) + ring(70_000, 8)
        + max(ring(40, 8), ring(900, 8)) + ring(3000, 8))
    assert pred["our DDP + PowerSGD", 8] > link["our DDP + PowerSGD", 8]
    assert pred["our DDP", 1] == link["our DDP", 1]  # one node: nothing sent
    rows = nettrain.with_model(rows)
    assert all(r["model_link"] == pytest.approx(link[r["name"], r["nodes"]]) and
               r["model"] == pytest.approx(pred[r["name"], r["nodes"]])
               for r in rows if r["part"] == "step")


def _sent_after_steps(rank, world_size):
    steps, params = nettrain._steps(rank, world_size, 2)
    before = nettrain._sent(steps)
    for name in ("our DDP", "torch DDP", "our DDP + PowerSGD"):
        for _ in range(3):  # the rebuild after the first backward; PowerSGD from the third
            steps[name]()
    return before, nettrain._sent(steps), params


def test_nettrain_records_the_buckets_each_ddp_rebuilt():
    before, after, params = launch(_sent_after_steps, 1, backend="gloo")[0]
    assert before["our DDP"] == [sum(params)]  # the first backward's one bucket
    # BigNet's parameters are conv1, conv2, fc1, fc2 (weight, bias): after the rebuild fc2 and
    # fc1 fill the first 1 MiB bucket, the convolutions the second; torch's log says the same
    fc, conv = sum(params[4:]), sum(params[:4])
    assert after["our DDP"] == after["torch DDP"] == [fc, conv]
    sent = after["our DDP + PowerSGD"]
    assert len(sent) == 6 and sent[0] == 4 * (128 + 10) and sent[3] == 4 * (64 + 32)  # biases
    assert 0 < sum(sent) < sum(params) / 50  # P's and Q's: rank 2 of every matrix


def test_nettrain_efficiency_separates_the_cpu_from_the_link():
    eff = nettrain_efficiency(_nettrain_rows())
    assert list(dict.fromkeys(name for name, _ in eff)) == list(nettrain.STRATEGIES)
    one = 0.040 * 1.25
    for p in (1, 2, 4, 8):
        e, cpu = eff["our DDP", p]
        assert e == pytest.approx(one / 0.5) and cpu == pytest.approx(one / (0.040 * (1 + p / 4)))


def test_nettrain_report_and_figure(figures, capsys):
    write_csv(nettrain.NAME, nettrain.with_model(_nettrain_rows()), "2 cores (test), no GPU")
    rows, _ = read_csv(nettrain.NAME)
    nettrain.report(rows)
    out = capsys.readouterr().out
    t = {(r["name"], r["nodes"]): r for r in rows if r["part"] == "step"}
    worst = max(abs(r["model"] / r["seconds"] - 1) for r in t.values())
    assert f"worst {worst:.1%}" in out, out
    (png,) = nettrain.draw()
    assert os.path.getsize(png) > 20_000


# ---- netaccuracy ------------------------------------------------------------------------

def _curves():
    acc = {"synchronous DDP": [0.70, 0.79, 0.81, 0.84], "PowerSGD": [0.65, 0.78, 0.80, 0.83],
           "local SGD (H = 8)": [0.70, 0.80, 0.82, 0.835],
           "DiLoCo (H = 24)": [0.6, 0.7, 0.75, 0.78]}
    per_step = {"synchronous DDP": (0.12, 100e3), "PowerSGD": (0.03, 10e3),
                "local SGD (H = 8)": (0.02, 12e3), "DiLoCo (H = 24)": (0.015, 3e3)}
    return {m: [{"step": 72 * (i + 1), "seconds": 72 * (i + 1) * per_step[m][0],
                 "bytes": 72 * (i + 1) * per_step[m][1], "accuracy": a, "loss": 1 - a}
                for i, a in enumerate(acc[m])] for m in acc}


def test_netaccuracy_time_and_bytes_to_the_target_are_the_first_crossing():
    s = netaccuracy_summary(netaccuracy.rows_of(_curves()))
    assert NETACCURACY_TARGET == 0.80
    assert s["synchronous DDP"]["step"] == 216
    assert s["synchronous DDP"]["seconds"] == pytest.approx(216 * 0.12)
    assert s["PowerSGD"]["bytes"] == pytest.approx(216 * 10e3)
    assert s["local SGD (H = 8)"]["step"] == 144  # 0.80 counts: >= the target
    assert s["DiLoCo (H = 24)"]["seconds"] is None and s["DiLoCo (H = 24)"]["final"] == 0.78


def test_netaccuracy_report_and_figure(figures, capsys):
    write_csv(netaccuracy.NAME, netaccuracy.rows_of(_curves()), "2 cores (test), Fashion-MNIST")
    rows, _ = read_csv(netaccuracy.NAME)
    netaccuracy.report(rows)
    out = capsys.readouterr().out
    assert "local SGD (H = 8)      2.9 s,    1.73 MB per node (step 144)" in out, out
    assert "DiLoCo (H = 24)    not reached" in out and "-6.0 points vs synchronous" in out, out
    (png,) = netaccuracy.draw()
    assert os.path.getsize(png) > 20_000


@pytest.fixture
def no_data(monkeypatch):
    """A machine with no dataset: MNIST cannot be fetched, no Fashion-MNIST files, nothing
    chosen by DIST_SGD_DATASET (conftest's "synthetic" unset)."""
    def absent(*args, **kwargs):
        raise data.DatasetNotFound("not on this machine (test)")
    monkeypatch.delenv("DIST_SGD_DATASET", raising=False)
    monkeypatch.setattr(data, "mnist", absent)
    monkeypatch.setattr(data, "fashion_mnist", absent)


def test_netaccuracy_without_data_trains_on_the_lessons_fallback_and_says_so(no_data, capsys):
    assert netaccuracy.dataset() == "synthetic"
    out = capsys.readouterr().out
    assert "netaccuracy: Fashion-MNIST not available: not on this machine" in out, out
    assert "dataset: synthetic" in out, out  # get_dataset("auto") says which, and why


def _accuracy_on_the_fallback(rank, world_size):
    return netaccuracy._node_work(rank, world_size, True, "synthetic")


def test_netaccuracy_node_part_trains_every_method_on_the_fallback():
    curves = launch(_accuracy_on_the_fallback, 2, backend="gloo")[0]
    assert list(curves) == list(netaccuracy.METHODS)
    steps = netaccuracy.settings(True)["steps"]
    for method, curve in curves.items():
        assert curve[-1]["step"] == steps and 0.0 <= curve[-1]["accuracy"] <= 1.0, method
        assert [r["bytes"] for r in curve] == sorted(r["bytes"] for r in curve), method


# ---- inside emulated nodes (root) -------------------------------------------------------

@pytest.mark.skipif(PROBLEM is not None, reason=f"no cluster here: {PROBLEM}")
def test_netscale_runs_inside_two_nodes_and_leaves_nothing_behind(capsys):
    out = nodes.on_nodes("dist_sgd.bench.netscale", 2, quick=True)
    assert "left behind by the 2-node cluster: nothing" in capsys.readouterr().out
    assert out["nodes"] == 2 and all(d <= 1e-5 for d in out["diffs"].values()), out["diffs"]
    rows = netscale_with_model(netscale._rows(out))
    assert all(r["model"] > 0 for r in rows if r["part"] != "cpu")
    cpu = [r for r in rows if r["part"] == "cpu"]  # the machine's share, measured in 2 nodes
    assert [r["bytes"] for r in cpu] == list(netscale.settings(True)["cpu"][0]), cpu
    # >= 0: a machine busy with other work burns as much while nobody sends (exchange_cpu takes
    # that off), so a message's own cost can read 0 there: only a quiet machine measures it
    assert all(r["seconds"] >= 0 and r["cores"] == os.cpu_count() for r in cpu), cpu
    # 1 MiB over a 100 Mbit/s link: no faster than the link (TCP's ceiling + the bucket's 70 KB)
    big = [r for r in rows if r["part"] == "all-reduce" and r["bytes"] == MiB]
    fastest = (MiB - cluster.SCALING_BURST) / cluster.link_goodput(100e6)
    assert all(r["seconds"] > 0.9 * fastest for r in big), big
    assert not [n for n in netns.ours() if str(os.getpid()) in n]


# ---- modelpar (lessons 19-20) -------------------------------------------------------------

def test_modelpar_node_work_over_loopback_and_its_report_and_figure(figures, capsys):
    """Its node part at world size 2 over loopback: tensor parallel's counted all-reduces equal
    the cost model's bytes; data parallel holds the whole model, the others half of it; the
    report and the figure come from the rows."""
    from dist_sgd.bench import modelpar

    rows = launch(modelpar._node_work, 2, True)[0]
    by = {r["strategy"]: r for r in rows}
    assert by["tensor"]["counted"] == pytest.approx(by["tensor"]["bytes"])
    assert by["data"]["bytes"] > by["tensor"]["bytes"] > by["pipeline"]["bytes"] > 0
    full = 4 * by["data"]["params"]
    assert by["data"]["state_bytes"] == full
    assert by["pipeline"]["state_bytes"] == full // 2  # two equal stages
    assert full // 2 < by["tensor"]["state_bytes"] < full // 2 + 4 * 4 * 64  # fc2's whole bias
    write_csv("modelpar", rows)
    modelpar.report(read_csv("modelpar")[0])
    assert "tensor" in capsys.readouterr().out
    assert os.path.getsize(modelpar.draw()[0]) > 10_000
