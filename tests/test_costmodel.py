"""The alpha-beta cost model, checked against things it does not compute itself: the messages
and bytes our all-reduce algorithms actually send (counted in a traced run), fits of data made
from known parameters, NCCL's bus-bandwidth identity, and the limits a model must respect.

Traced runs: one launch per world size wraps torch.distributed's point-to-point calls on every
rank, runs each algorithm once, and returns what every rank sent and received. The model's
coefficients (a messages and b * n bytes per all-reduce) count the busiest rank's critical
path: for the ring and halving-doubling, where every rank sends and receives at the same time,
that is what each rank sends; for naive and tree, whose root first receives and then sends,
it is everything the root sends and receives.
"""
import math

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from dist_sgd.scale import costmodel
from dist_sgd.scale.costmodel import (fit_alpha_beta, fit_all_reduce, fit_shaped_link,
                                      predict_all_reduce, shaped_link_sizes)
from dist_sgd.plumbing.launch import launch

SIZES = [2 ** k for k in range(10, 27, 2)]  # 1 KiB .. 64 MiB
NUMEL = 12 * 1024  # 48 KiB of float32: divides by 3 and 4 (equal chunks), one segment per chunk
BIG = 48 * 1024  # 192 KiB: the tree's messages and halving-doubling's halves go by rendezvous


def _traced(rank, world_size):
    """{algorithm: {"sent": [bytes per message], "received": [...]}} of this rank."""
    from dist_sgd.comm.collectives import ALL_REDUCE_ALGORITHMS, all_reduce

    log = {"sent": [], "received": []}

    def counting(original, kind):
        def op(tensor, *args, **kwargs):
            log[kind].append(tensor.numel() * tensor.element_size())
            return original(tensor, *args, **kwargs)
        op.__name__ = original.__name__
        return op
    originals = {name: getattr(c10d, name) for name in ("send", "recv", "isend", "irecv")}
    wrapped = {name: counting(fn, "sent" if "send" in name else "received")
               for name, fn in originals.items()}
    out = {}
    for algorithm in ALL_REDUCE_ALGORITHMS:
        for module in (c10d, dist):  # P2POp checks its op against c10d's own isend / irecv
            for name, fn in wrapped.items():
                setattr(module, name, fn)
        try:
            x = torch.ones(NUMEL)
            all_reduce(x, algorithm=algorithm)
        finally:
            for module in (c10d, dist):
                for name, fn in originals.items():
                    setattr(module, name, fn)
        assert torch.equal(x, torch.full_like(x, world_size))  # the traced run was a right one
        out[algorithm] = {k: list(v) for k, v in log.items()}
        log["sent"].clear(), log["received"].clear()
    out["tree sends"] = _tree_send_order(world_size, originals, NUMEL)
    out["tree sends, big"] = _tree_send_order(world_size, originals, BIG)
    # halving-doubling at BIG: its exchanges of >= RENDEZVOUS_BYTES are acknowledged
    sent = []

    def isend(tensor, *args, **kwargs):
        sent.append(tensor.numel() * tensor.element_size())
        return originals["isend"](tensor, *args, **kwargs)
    for module in (c10d, dist):
        setattr(module, "isend", isend)
    try:
        all_reduce(torch.ones(BIG), algorithm="halving_doubling")
    finally:
        for module in (c10d, dist):
            setattr(module, "isend", originals["isend"])
    out["halving_doubling, big"] = sent
    return out


def _tree_send_order(world_size, originals, numel):
    """Rank 0's tree broadcast, as events: ("send", peer) when a send is posted, ("done", peer)
    when it is waited for, ("ack", peer) when a child's ack has come back."""
    from dist_sgd.comm.allreduce import tree_broadcast
    from dist_sgd.comm.wire import Link

    events = []

    class Request:
        def __init__(self, request, peer):
            self.request, self.peer = request, peer

        def wait(self):
            self.request.wait()
            events.append(("done", self.peer))

    def isend(tensor, dst, *args, **kwargs):
        events.append(("send", dst))
        return Request(originals["isend"](tensor, dst, *args, **kwargs), dst)

    def irecv(tensor, src, *args, **kwargs):
        request = originals["irecv"](tensor, src, *args, **kwargs)
        return Request(request, src) if tensor.numel() > 1 else Ack(request, src)

    class Ack(Request):
        def wait(self):
            self.request.wait()
            events.append(("ack", self.peer))
    for module in (c10d, dist):
        module.isend, module.irecv = isend, irecv
    try:
        tree_broadcast(Link("broadcast"), torch.ones(numel))
    finally:
        for module in (c10d, dist):
            module.isend, module.irecv = originals["isend"], originals["irecv"]
    return events if dist.get_rank() == 0 else None


@pytest.fixture(scope="module", params=[3, 4])  # 3: chunks around an odd ring; 4: a power of two
def traced(request):
    """(world size, [per rank: {algorithm: {"sent": [...], "received": [...]}}])."""
    return request.param, launch(_traced, request.param, backend="gloo")


def _model(algorithm, p):
    a, b, _ = costmodel.coefficients(algorithm, p)
    return a, b * NUMEL * 4  # messages, bytes


@pytest.mark.parametrize("algorithm", ["ring", "ring_pipelined"])
def test_ring_bytes_each_rank_sends_match_the_model(traced, algorithm):
    p, ranks = traced
    assert algorithm in ranks[0], f"{algorithm} was not traced: not in ALL_REDUCE_ALGORITHMS"
    for rank in ranks:
        assert sum(rank[algorithm]["sent"]) == _model(algorithm, p)[1]
        assert sum(rank[algorithm]["received"]) == _model(algorithm, p)[1]


def test_ring_messages_each_rank_sends_match_the_model(traced):
    p, ranks = traced
    for rank in ranks:
        assert len(rank["ring"]["sent"]) == _model("ring", p)[0] == 2 * (p - 1)


def test_halving_doubling_matches_the_model(traced):
    p, ranks = traced
    messages, nbytes = _model("halving_doubling", p)
    hd = [rank["halving_doubling"]["sent"] for rank in ranks]
    if p & (p - 1) == 0:  # every rank sends log2 p halving and log2 p doubling messages
        assert all(len(sent) == messages and sum(sent) == nbytes for sent in hd)
    else:  # p = 3: the critical path is rank 0's fold-in, then everything its partner sends
        # (its halving and doubling exchanges with rank 2, and the fold-out): the +2 terms
        assert len(hd[0]) + len(hd[1]) == messages and sum(hd[0]) + sum(hd[1]) == nbytes


@pytest.mark.parametrize("algorithm", ["ring", "halving_doubling"])
def test_steps_are_the_messages_each_rank_sends(traced, algorithm):
    # the CPU share charges every step by its own size: the sizes must be the real ones
    p, ranks = traced
    model = sorted(round(f * NUMEL * 4) for count, f in costmodel.steps(algorithm, p)
                   for _ in range(count))
    if algorithm == "ring" or p & (p - 1) == 0:
        assert all(sorted(rank[algorithm]["sent"]) == model for rank in ranks), model
    else:  # p = 3: the fold-in from rank 0, then rank 1 stands for both (its halving and
        # doubling exchange with rank 2, and the fold-out)
        assert sorted(ranks[0][algorithm]["sent"] + ranks[1][algorithm]["sent"]) == model


@pytest.mark.parametrize("algorithm", ["naive", "tree"])
def test_root_traffic_matches_the_model(traced, algorithm):
    p, ranks = traced
    root = ranks[0][algorithm]
    messages, nbytes = _model(algorithm, p)
    assert len(root["sent"]) + len(root["received"]) == messages
    assert sum(root["sent"]) + sum(root["received"]) == nbytes


def test_no_rank_is_busier_than_the_root(traced):
    # the model's naive and tree costs count the root: nobody may move more than it
    p, ranks = traced
    for algorithm in ("naive", "tree"):
        root = sum(map(sum, ranks[0][algorithm].values()))
        assert all(sum(map(sum, rank[algorithm].values())) <= root for rank in ranks)


def test_fit_recovers_alpha_beta_from_exact_data():
    alpha, beta = 30e-6, 1 / 2e9  # 30 us, 2 GB/s
    a, b = fit_alpha_beta(SIZES, [alpha + beta * n for n in SIZES])
    assert a == pytest.approx(alpha, rel=1e-9) and b == pytest.approx(beta, rel=1e-9)


def test_fit_tolerates_noise_and_weights_small_sizes():
    rng = np.random.default_rng(0)
    alpha, beta = 50e-6, 1 / 1e9
    n = np.repeat(SIZES, 5)
    a, b = fit_alpha_beta(n, (alpha + beta * n) * rng.uniform(0.95, 1.05, n.size))
    # relative weighting: alpha is pinned by the small sizes, not drowned by 64 MiB
    assert a == pytest.approx(alpha, rel=0.1) and b == pytest.approx(beta, rel=0.05)


def test_fit_never_returns_negative_latency():
    n = np.array(SIZES, dtype=float)
    a, b = fit_alpha_beta(n, n / 1e9 - 5e-8)  # an exact line with a negative intercept
    assert a == 0.0 and b == pytest.approx(1e-9, rel=0.1)


def test_shaped_link_fit_ignores_the_sizes_the_token_bucket_speeds_up():
    alpha, beta, KiB, MiB = 300e-6, 8 / 96e6, 2 ** 10, 2 ** 20  # 300 us, 96 Mbit/s
    for quick in (False, True):
        rows = [{"bytes": n, "seconds": alpha + beta * n} for n in shaped_link_sizes(quick)]
        # 64 KiB and 1 MiB as tbf shows them after a pause: far faster than the line
        rows += [{"bytes": 64 * KiB, "seconds": (alpha + beta * 64 * KiB) / 3},
                 {"bytes": MiB, "seconds": (alpha + beta * MiB) / 1.07}]
        a, b = fit_shaped_link(rows)
        assert a == pytest.approx(alpha, rel=1e-6) and b == pytest.approx(beta, rel=1e-6)
        assert fit_alpha_beta([r["bytes"] for r in rows], [r["seconds"] for r in rows]) != \
            pytest.approx((alpha, beta), rel=1e-3)  # one line through every size is tilted


def test_shaped_link_fit_keeps_alpha_from_the_small_messages_alone():
    beta, MiB = 8 / 96e6, 2 ** 20
    # big messages shifted by the bucket's head start: the slope survives, the intercept not
    rows = [{"bytes": n, "seconds": beta * n - 5.8e-3} for n in (4 * MiB, 16 * MiB)]
    rows += [{"bytes": n, "seconds": 200e-6 + beta * n + d}
             for n, d in ((64, 0.0), (1024, 50e-6), (64, -20e-6))]
    a, b = fit_shaped_link(rows)
    assert b == pytest.approx(beta, rel=1e-9)
    assert a == pytest.approx(200e-6, rel=1e-6)  # the median of 200, 250 and 180 us


def test_fit_link_falls_back_to_the_line_through_every_size_where_big_messages_show_no_slope():
    link = [{"bytes": n, "seconds": 2e-4 + 8e-8 * n} for n in shaped_link_sizes()]
    assert costmodel.fit_link(link) == pytest.approx(fit_shaped_link(link))
    # loopback on a busy machine: 16 MiB measured faster than 4 MiB
    loop = [{"bytes": n, "seconds": t} for n, t in
            ((64, 2e-5), (1024, 2.2e-5), (4 * 2 ** 20, 2.1e-3), (16 * 2 ** 20, 2.0e-3))]
    with pytest.raises(ValueError, match="not a link"):
        fit_shaped_link(loop)
    alpha, beta = costmodel.fit_link(loop)
    assert (alpha, beta) == fit_alpha_beta([r["bytes"] for r in loop],
                                           [r["seconds"] for r in loop])
    assert alpha >= 0 and beta >= 0


def test_fit_all_reduce_recovers_one_network_from_every_algorithm():
    alpha, beta, gamma = 20e-6, 1 / 3e9, 1 / 10e9
    rows = [(a, n, p) for a in ("naive", "tree", "ring", "halving_doubling")
            for p in (2, 3, 4) for n in SIZES]
    t = [predict_all_reduce(a, n, p, alpha, beta, gamma) for a, n, p in rows]
    a, b = fit_all_reduce(*zip(*rows), t, gamma=gamma)
    assert a == pytest.approx(alpha, rel=1e-9) and b == pytest.approx(beta, rel=1e-9)


@pytest.mark.parametrize("p", [2, 3, 4, 8, 1024])
def test_ring_bus_bandwidth_is_the_link_bandwidth(p):
    # NCCL's bus bandwidth divides out the ring's bytes: a latency-free ring shows 1/beta
    beta = 1 / 7e9
    t = predict_all_reduce("ring", 1 << 26, p, 0.0, beta)
    assert costmodel.bus_bandwidth(1 << 26, p, t) == pytest.approx(1 / beta)


@pytest.mark.parametrize("p", [2, 4, 8, 64])
def test_ring_and_halving_doubling_move_the_same_bytes_at_powers_of_two(p):
    # the same data; halving-doubling's rendezvous acks add 4 bytes each
    acks = sum(k for k, f in costmodel.acks("halving_doubling", p) if f * 2 ** 20 >= 2 ** 16)
    assert predict_all_reduce("ring", 1 << 20, p, 0, 1e-9) + acks * 4e-9 == pytest.approx(
        predict_all_reduce("halving_doubling", 1 << 20, p, 0, 1e-9))


def test_ring_beats_tree_only_for_large_messages():
    al, be = 50e-6, 1 / 1e9
    assert predict_all_reduce("ring", 1024, 16, al, be) > predict_all_reduce("tree", 1024, 16, al, be)
    assert predict_all_reduce("ring", 1 << 26, 16, al, be) < predict_all_reduce("tree", 1 << 26, 16, al, be)


def _binomial_rounds(p):
    """Rounds a broadcast from one rank needs when, each round, every rank that has the
    tensor sends it to one that has not (a binomial tree); the reduce is the same run back."""
    have, rounds = 1, 0
    while have < p:
        have, rounds = min(p, 2 * have), rounds + 1
    return rounds


@pytest.mark.parametrize("p", [2, 3, 4, 5, 7, 8, 9, 16, 17, 1000, 1024])
def test_tree_latency_counts_the_rounds_of_a_binomial_tree(p):
    # counted by playing the rounds out, not by the formula: p = 3, 5, 1000 need a whole round
    # for their last ranks (rounding log2 p down, or not at all, fails here)
    assert predict_all_reduce("tree", 0, p, 1.0, 0) == 2 * _binomial_rounds(p)
    assert predict_all_reduce("tree", 1, p, 0, 1.0) == 2 * _binomial_rounds(p)  # whole tensor


def test_tree_broadcast_sends_to_one_child_at_a_time_biggest_subtree_first(traced):
    # The model's tree takes log2 p rounds only if a parent's sends do not share its link:
    # each send is waited for before the next, to the child with the biggest subtree first;
    # a big one until the child's ack says it arrived (a returned send is still in the kernel)
    p, ranks = traced
    children = [2 ** k for k in reversed(range(math.ceil(math.log2(p))))]
    assert ranks[0]["tree sends"] == [e for c in children for e in (("send", c), ("done", c))]
    assert ranks[0]["tree sends, big"] == [e for c in children
                                           for e in (("send", c), ("done", c), ("ack", c))]


def test_halving_doubling_acks_its_big_exchanges_as_the_model_counts(traced):
    p, ranks = traced
    acks = sum(count for count, f in costmodel.acks("halving_doubling", p)
               if f * BIG * 4 >= costmodel.RENDEZVOUS_BYTES)
    sent = [rank["halving_doubling, big"] for rank in ranks]
    data = sorted(round(f * BIG * 4) for count, f in costmodel.steps("halving_doubling", p)
                  for _ in range(count))
    if p & (p - 1) == 0:  # every rank is on the critical path: its data, then one ack each
        assert all(sorted(n for n in s if n > 4) == data and s.count(4) == acks for s in sent)
    else:  # p = 3: rank 1 (rank 0's fold partner) carries the path's exchanges and acks
        assert sent[1].count(4) == acks and sent[0].count(4) == 0  # the fold goes eagerly


def test_rendezvous_threshold_is_the_wires():
    from dist_sgd.comm import wire

    assert costmodel.RENDEZVOUS_BYTES == wire.RENDEZVOUS_BYTES


@pytest.mark.parametrize("p", [2, 3, 4, 16])
def test_big_messages_pay_a_latency_per_rendezvous_ack(p):
    ack = ALPHA + costmodel.ACK_BYTES * BETA
    rounds = math.ceil(math.log2(p))
    for n, on in ((60_000, False), (2 ** 20, True)):  # below and above RENDEZVOUS_BYTES
        a, b, _ = costmodel.coefficients("tree", p)
        assert predict_all_reduce("tree", n, p, ALPHA, BETA) == pytest.approx(
            a * ALPHA + b * n * BETA + (rounds * ack if on else 0))
    q = 1 << (p.bit_length() - 1)
    n = 2 ** 20  # halving-doubling's halves: n/2, n/4, ... acknowledged while >= 64 KiB
    big = sum(2 for k in range(1, q.bit_length()) if n * 0.5 ** k >= 64 * 1024)
    a, b, _ = costmodel.coefficients("halving_doubling", p)
    assert predict_all_reduce("halving_doubling", n, p, ALPHA, BETA) == pytest.approx(
        a * ALPHA + b * n * BETA + big * ack)
    assert predict_all_reduce("ring", n, p, ALPHA, BETA) == pytest.approx(
        2 * (p - 1) * (ALPHA + n / p * BETA))  # the ring sends on one link in order: no acks


def test_world_size_one_costs_nothing():
    for algorithm in costmodel.ALGORITHMS:
        assert predict_all_reduce(algorithm, 1 << 20, 1, 1e-3, 1e-6, 1e-6) == 0.0
    step, eff = costmodel.predict_step(0.1, 1 << 20, 1, "ring", 1e-3, 1e-6)
    assert step == pytest.approx(0.1) and eff == pytest.approx(1.0)


def test_perfect_overlap_hides_communication_shorter_than_compute():
    step, eff = costmodel.predict_step(0.2, 1e8, 64, "ring", 0, 1e-9, overlap=True)
    assert step == pytest.approx(0.2) and eff == pytest.approx(1.0)


def test_efficiency_falls_as_workers_grow():
    effs = [costmodel.predict_step(0.05, 4.8e6, p, "ring", 25e-6, 8e-10)[1] for p in (2, 8, 64, 1024)]
    assert all(a > b for a, b in zip(effs, effs[1:])) and 0 < effs[-1] < 1


def test_predictions_take_arrays():
    t = predict_all_reduce("ring", np.array(SIZES), 4, 1e-5, 1e-9)
    assert t.shape == (len(SIZES),) and np.all(np.diff(t) > 0)


def test_bandwidth_of_an_unresolved_beta_is_infinite():
    assert costmodel.bandwidth(0.0) == float("inf") and costmodel.bandwidth(1e-9) == pytest.approx(1e9)


def test_link_converts_gbit_and_microseconds():
    assert costmodel.link(10, 25) == pytest.approx((25e-6, 0.8e-9))


@pytest.mark.parametrize("algorithm", costmodel.ALGORITHMS)
@pytest.mark.parametrize("p", [1, 2, 3, 5, 8, 16])
def test_coefficients_add_up_the_steps(algorithm, p):
    a, b, c = costmodel.coefficients(algorithm, p)
    path = costmodel.steps(algorithm, p)
    assert a == sum(k for k, _ in path) and b == pytest.approx(sum(k * f for k, f in path))
    assert c == pytest.approx(b / 2)
    assert predict_all_reduce(algorithm, 1000, p, 1e-4, 1e-8) == pytest.approx(
        a * 1e-4 + 1000 * b * 1e-8)  # 1000 bytes: below RENDEZVOUS_BYTES, no acks


ALPHA, BETA, KAPPA, PER_BYTE = 200e-6, 8e-8, 300e-6, 2e-9


@pytest.mark.parametrize("algorithm", costmodel.ALGORITHMS)
def test_with_a_core_per_rank_the_cpu_share_is_the_link_alone(algorithm):
    # a message's CPU (100 us + 2 ns/B) is below its link time (200 us + 80 ns/B): hidden
    for p in (1, 2, 3):
        for n in (64, 2 ** 20):
            assert predict_all_reduce(algorithm, n, p, ALPHA, BETA, cpu=(1e-4, PER_BYTE, 4)) \
                == pytest.approx(predict_all_reduce(algorithm, n, p, ALPHA, BETA))
    # and a rank's own CPU bounds a step even with a core to itself (300 us > 200 us)
    if algorithm != "parameter_server":
        assert predict_all_reduce(algorithm, 64, 2, ALPHA, BETA, cpu=(KAPPA, 0.0, 4)) \
            == pytest.approx(2 * KAPPA)  # p = 2: two messages on the path


def test_ranks_taking_turns_cost_each_step_the_slower_of_link_and_cpu():
    p, cores = 16, 2  # 8 ranks per core
    assert costmodel.turns(p, cores) == 8.0 and costmodel.turns(2, 4) == 1.0
    for n in (1024, 2 ** 20, 2 ** 24):
        m = n / p  # the ring's 30 steps, each of one chunk, written out
        want = 30 * max(ALPHA + m * BETA, 8 * (KAPPA + m * PER_BYTE))
        got = predict_all_reduce("ring", n, p, ALPHA, BETA, cpu=(KAPPA, PER_BYTE, cores))
        assert got == pytest.approx(want)
    # small messages: the CPU's turns (30 x 8 x 300 us); big ones: the link, as alone
    assert predict_all_reduce("ring", 1024, p, ALPHA, BETA, cpu=(KAPPA, PER_BYTE, cores)) \
        == pytest.approx(30 * 8 * (KAPPA + 64 * PER_BYTE))
    assert predict_all_reduce("ring", 2 ** 24, p, ALPHA, BETA, cpu=(KAPPA, PER_BYTE, cores)) \
        == pytest.approx(predict_all_reduce("ring", 2 ** 24, p, ALPHA, BETA))
    # halving-doubling's steps halve: its big first steps are the link's, its small last the CPU's
    hd = predict_all_reduce("halving_doubling", 2 ** 16, p, ALPHA, BETA, cpu=(KAPPA, 0.0, cores))
    assert hd == pytest.approx(sum(2 * max(ALPHA + 2 ** 16 / 2 ** k * BETA, 8 * KAPPA)
                                   for k in range(1, 5)))


def test_fit_cpu_recovers_the_cost_per_message_and_per_byte():
    rows = [{"bytes": n, "seconds": KAPPA + PER_BYTE * n} for n in (64, 65536, 2 ** 20)]
    assert costmodel.fit_cpu(rows) == pytest.approx((KAPPA, PER_BYTE))
    flat = [{"bytes": n, "seconds": t} for n, t in ((64, 3e-4), (2 ** 20, 2.9e-4))]
    assert costmodel.fit_cpu(flat) == pytest.approx((2.95e-4, 0.0))  # no cost per byte seen
    with pytest.raises(ValueError, match="two or more sizes"):
        costmodel.fit_cpu(rows[:1])
    # every size counts the same: measured in a 2-node cluster (us per message), where the
    # plain least-squares line's intercept was 789 us, 2.2x the 64 B message's own cost
    measured = [{"bytes": n, "seconds": us * 1e-6}
                for n, us in ((64, 356), (65536, 1344), (2 ** 20, 2268))]
    kappa, per_byte = costmodel.fit_cpu(measured)
    assert 356e-6 < kappa < 1.25 * 356e-6 and per_byte > 0
    assert kappa + per_byte * 2 ** 20 == pytest.approx(2268e-6, rel=0.25)
    idle = [{"bytes": n, "seconds": t} for n, t in ((64, 0.0), (2 ** 20, 1e-3))]
    kappa, per_byte = costmodel.fit_cpu(idle)  # no cost per message seen: none charged
    assert kappa == 0.0 and 0 < per_byte <= 1e-3 / 2 ** 20


def test_crossover_is_where_the_ring_stops_being_slower():
    p = 16
    n = costmodel.crossover("tree", "ring", p, ALPHA, BETA)
    # ring = tree: 30 a + 1.875 n b = 8 a + 8 n b, so n = 22 a / (6.125 b)
    assert n == pytest.approx(22 * ALPHA / (6.125 * BETA), rel=0.02)
    assert costmodel.crossover("halving_doubling", "ring", p, ALPHA, BETA) is None  # never
    assert costmodel.crossover("tree", "ring", 2, ALPHA, BETA) == 1.0  # p = 2: at every size
    # the CPU's turns make every step dearer, the ring's 30 most: it catches up later
    cpu = (KAPPA, PER_BYTE, 2)
    assert costmodel.crossover("tree", "ring", p, ALPHA, BETA, cpu=cpu) > n


def test_human_bytes():
    assert [costmodel.human_bytes(n) for n in (8, 1536, 2 ** 26)] == ["8 B", "1.5 KiB", "64 MiB"]


@pytest.mark.parametrize("call, message", [
    (lambda: predict_all_reduce("butterfly", 10, 2, 0, 0), "unknown algorithm"),
    (lambda: predict_all_reduce("ring", 10, 0, 0, 0), "world_size"),
    (lambda: predict_all_reduce("ring", 10, 2.5, 0, 0), "world_size"),
    (lambda: predict_all_reduce("ring", -1, 2, 0, 0), "nbytes"),
    (lambda: predict_all_reduce("ring", 10, 2, -1e-6, 0), "alpha"),
    (lambda: predict_all_reduce("ring", 10, 2, 0, 0, cpu=(1e-4, 0, 0)), "cores"),
    (lambda: predict_all_reduce("ring", 10, 2, 0, 0, cpu=(-1e-4, 0, 2)), "kappa"),
    (lambda: fit_alpha_beta([1, 2, 3], [1.0, 2.0]), "one time per size"),
    (lambda: fit_alpha_beta([8, 8, 8], [1.0, 1.1, 0.9]), "two or more different sizes"),
    (lambda: fit_alpha_beta([8, 16], [1.0, 0.0]), "times must be"),
    (lambda: fit_alpha_beta([8, -16], [1.0, 2.0]), "sizes must be"),
    (lambda: fit_all_reduce(["ring", "ring"], [8, 16], [1, 1], [1.0, 2.0]), "world size 1"),
    (lambda: fit_shaped_link([{"bytes": 64, "seconds": 1e-4},
                              {"bytes": 4 * 2 ** 20, "seconds": 0.4}]), "two sizes >= 2 MiB"),
    (lambda: fit_shaped_link([{"bytes": n, "seconds": 1.0 - n / 2 ** 30}
                              for n in (64, 4 * 2 ** 20, 16 * 2 ** 20)]), "not a link"),
])
def test_bad_input_gives_clear_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_bytes_per_strategy_follow_their_formulas():
    """Data parallel: the ring's 2(p-1)/p of the gradients; tensor parallel: four all-reduces
    of the activations per block; pipeline: an activation and its gradient; nothing at p = 1."""
    params, layers, act = 12 * 64 ** 2, 6, 8 * 16 * 64
    assert costmodel.parallel_bytes("data", params, layers, act, 4) == 4 * 1.5 * params
    assert costmodel.parallel_bytes("tensor", params, layers, act, 2, elem=8) == 8 * 4 * 6 * act
    assert costmodel.parallel_bytes("tensor", params, layers, act, 2, allreduces=2) == \
        4 * 2 * 6 * act  # an MLP block alone: f and g
    assert costmodel.parallel_bytes("pipeline", params, layers, act, 3) == 4 * 2 * act
    assert all(costmodel.parallel_bytes(s, params, layers, act, 1) == 0
               for s in costmodel.STRATEGIES)
    assert costmodel.parallel_state_bytes("data", params, 4) == 16 * params
    assert costmodel.parallel_state_bytes("tensor", params, 4) == 4 * params
    with pytest.raises(ValueError, match="strategy must be one of data, tensor, pipeline"):
        costmodel.parallel_bytes("expert", params, layers, act, 2)
