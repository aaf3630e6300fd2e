"""The parameter server against torch: sync PS == all-reduce SGD, async PS with one worker ==
plain SGD; a dead or silent rank ends the run with its name; Hogwild's shared model learns.

One launch of 4 ranks runs every equality scenario (the ranks a scenario does not use skip
it); float64, so "equal" means rounding of a different summation order (~1e-15).
"""
import os
import time

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from dist_sgd.beyond import ps
from dist_sgd.sgd.data import synthetic
from dist_sgd.beyond.hogwild import hogwild
from dist_sgd.plumbing.launch import RankError, launch
from dist_sgd.sgd.models import MLP
from dist_sgd.sgd.train import evaluate

STEPS, PER_WORKER, LR, MOMENTUM, WD = 4, 5, 0.1, 0.9, 1e-3


class Tied(nn.Module):
    """A frozen layer (it must not travel) and a weight shared by two layers (it travels once)."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(784, 7)
        self.frozen = nn.Linear(7, 7)
        self.frozen.requires_grad_(False)
        self.a, self.b = nn.Linear(7, 7), nn.Linear(7, 7)
        self.b.weight = self.a.weight
        self.head = nn.Linear(7, 10)

    def forward(self, x):
        h = torch.tanh(self.a(self.frozen(torch.tanh(self.inp(x.flatten(1))))))
        return F.log_softmax(self.head(torch.tanh(self.b(h))), dim=1)


class WithUnused(Tied):
    """Tied plus a trainable layer forward never uses: it gets no gradient (p.grad is None), so
    torch's SGD leaves it alone despite momentum and weight decay, and so must the server."""

    def __init__(self):
        super().__init__()
        self.unused = nn.Linear(7, 3)


def batches(n_workers):
    """STEPS global batches of PER_WORKER items per worker (the same on every rank)."""
    data = synthetic(n=STEPS * PER_WORKER * n_workers, seed=3)
    x, y = data.images.double(), data.labels
    return x.view(STEPS, n_workers * PER_WORKER, 1, 28, 28), y.view(STEPS, -1)


def fresh(cls=Tied):
    torch.manual_seed(0)
    return cls().double()


def weights(model):
    return ps.flat_weights(model).clone()


def ps_run(rank, servers, workers, mode, cls=Tied, **kw):
    """This rank's part in one PS run: a server's stats, or a worker's weights after each step."""
    model = fresh(cls)
    if rank in servers:
        return ps.ParameterServer(model, servers, workers, LR, MOMENTUM, WD, mode=mode,
                                  **kw).serve()
    if rank not in workers:
        return None
    x, y = batches(len(workers))
    me = slice(workers.index(rank) * PER_WORKER, (workers.index(rank) + 1) * PER_WORKER)
    worker, history = ps.Worker(model, servers), []
    worker.pull()
    for step in range(STEPS):
        model.zero_grad()
        F.nll_loss(model(x[step][me]), y[step][me]).backward()
        worker.push()
        worker.pull()
        history.append(weights(model))
    stats = worker.finish()
    return {"history": history, "final": weights(model), **stats}


def allreduce_run(rank, workers, group, cls=Tied):
    """The reference: all-reduce SGD among `workers` (torch's all_reduce and torch.optim.SGD)."""
    if rank not in workers:
        return None
    model = fresh(cls)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WD)
    x, y = batches(len(workers))
    me = slice(workers.index(rank) * PER_WORKER, (workers.index(rank) + 1) * PER_WORKER)
    history = []
    for step in range(STEPS):
        opt.zero_grad()
        F.nll_loss(model(x[step][me]), y[step][me]).backward()
        for p in model.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad, group=group)
                p.grad /= len(workers)
        opt.step()
        history.append(weights(model))
    return history


def plain_sgd(steps=STEPS, cls=Tied):
    model = fresh(cls)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WD)
    x, y = batches(1)
    history = []
    for step in range(steps):
        opt.zero_grad()
        F.nll_loss(model(x[step]), y[step]).backward()
        opt.step()
        history.append(weights(model))
    return history


def ordered_async(rank, token_group, staleness_aware):
    """Async PS, workers 1 and 2, in a forced order: worker 2 pulls version 0, then waits until
    worker 1 has pushed all its STEPS gradients; so its first gradient is STEPS updates stale."""
    servers, workers = [0], [1, 2]
    model = fresh()
    if rank == 0:
        return ps.ParameterServer(model, servers, workers, LR, MOMENTUM, WD, mode="async",
                                  staleness_aware=staleness_aware).serve()
    if rank not in workers:
        return None
    x, y = batches(2)
    me = slice((rank - 1) * PER_WORKER, rank * PER_WORKER)
    worker, token = ps.Worker(model, servers), torch.zeros(1)
    worker.pull()
    for step in range(STEPS):
        if rank == 2 and step == 0:
            dist.recv(token, 1, group=token_group)  # worker 1 is done pushing
        model.zero_grad()
        F.nll_loss(model(x[step][me]), y[step][me]).backward()
        worker.push()
        worker.pull()
    if rank == 1:
        dist.send(token, 2, group=token_group)
    return {**worker.finish(), "final": weights(model)}


def replay_ordered(staleness_aware):
    """The same updates, one after the other in one process: worker 1's 4 gradients, then
    worker 2's first (computed on the initial weights), then its 3 fresh ones."""
    model = fresh()
    x, y = batches(2)
    start = weights(model)
    flat = torch.nn.Parameter(start.clone())
    opt = torch.optim.SGD([flat], lr=LR, momentum=MOMENTUM, weight_decay=WD)

    def grad_at(w, step, worker):
        trainable = [p for p in model.parameters() if p.requires_grad]
        torch.nn.utils.vector_to_parameters(w.detach().clone(), trainable)
        model.zero_grad()
        me = slice(worker * PER_WORKER, (worker + 1) * PER_WORKER)
        F.nll_loss(model(x[step][me]), y[step][me]).backward()
        return ps.flat_gradients(model)

    order = ([(0, k, 0) for k in range(STEPS)] + [(1, 0, STEPS)]
             + [(1, k, 0) for k in range(1, STEPS)])  # (worker, its step, staleness)
    for worker, step, stale in order:
        g = grad_at(start if stale else flat, step, worker)
        opt.param_groups[0]["lr"] = LR / max(1, stale) if staleness_aware else LR
        flat.grad = g
        opt.step()
    return flat.detach()


def scenarios(rank, world_size):
    groups = {"one server": dist.new_group([1, 2, 3]), "two servers": dist.new_group([2, 3]),
              "tokens": dist.new_group([1, 2])}
    out = {}
    out["sync 1x3"] = (ps_run(rank, [0], [1, 2, 3], "sync"),
                       allreduce_run(rank, [1, 2, 3], groups["one server"]))
    out["sync 2x2"] = (ps_run(rank, [0, 1], [2, 3], "sync"),
                       allreduce_run(rank, [2, 3], groups["two servers"]))
    out["async 1x1"] = (ps_run(rank, [0], [1], "async"), plain_sgd() if rank == 1 else None)
    out["async 1x3"] = (ps_run(rank, [0], [1, 2, 3], "async"), None)
    out["async aware"] = (ps_run(rank, [0], [1, 2, 3], "async", staleness_aware=True), None)
    out["sync unused"] = (ps_run(rank, [0, 1], [2, 3], "sync", cls=WithUnused),
                          allreduce_run(rank, [2, 3], groups["two servers"], cls=WithUnused))
    out["async unused"] = (ps_run(rank, [0], [1], "async", cls=WithUnused),
                           plain_sgd(cls=WithUnused) if rank == 1 else None)
    for aware in (False, True):
        out[f"ordered aware={aware}"] = (ordered_async(rank, groups["tokens"], aware), None)
    dist.barrier()
    return out


@pytest.fixture(scope="module")
def four():
    return launch(scenarios, 4, backend="gloo", timeout=60)


@pytest.mark.parametrize("case,workers", [("sync 1x3", [1, 2, 3]), ("sync 2x2", [2, 3])])
def test_sync_ps_equals_allreduce_sgd(four, case, workers):
    for w in workers:
        got, want = four[w][case]
        assert len(got["history"]) == STEPS
        for step in range(STEPS):
            torch.testing.assert_close(got["history"][step], want[step],
                                       msg=f"{case} rank {w} step {step}")


@pytest.mark.parametrize("case,worker", [("sync unused", 2), ("async unused", 1)])
def test_a_parameter_without_gradient_stays_where_torchs_sgd_leaves_it(four, case, worker):
    got, want = four[worker][case]
    for step in range(STEPS):
        torch.testing.assert_close(got["history"][step], want[step], msg=f"{case} step {step}")
    n = fresh(WithUnused).unused.weight.numel() + 3  # the unused layer: the last trainables
    torch.testing.assert_close(got["final"][-n:], weights(fresh(WithUnused))[-n:], rtol=0, atol=0)


def test_sync_ps_servers_hold_their_shard(four):
    s0, s1 = four[0]["sync 2x2"][0], four[1]["sync 2x2"][0]
    final = four[2]["sync 2x2"][0]["final"]
    assert s0["shard"][1] == s1["shard"][0] and s1["shard"][1] == final.numel()
    torch.testing.assert_close(torch.cat([s0["weights"], s1["weights"]]), final)
    assert s0["updates"] == s1["updates"] == STEPS
    assert s0["staleness"] == [0] * (2 * STEPS)  # synchronous: never stale


def test_async_ps_with_one_worker_equals_plain_sgd(four):
    got, want = four[1]["async 1x1"]
    for step in range(STEPS):
        torch.testing.assert_close(got["history"][step], want[step], msg=f"step {step}")
    assert four[0]["async 1x1"][0]["staleness"] == [0] * STEPS


@pytest.mark.parametrize("case", ["async 1x3", "async aware"])
def test_async_ps_counts_every_update_and_its_staleness(four, case):
    server = four[0][case][0]
    assert server["updates"] == 3 * STEPS  # every gradient applied, none waited for
    assert len(server["staleness"]) == 3 * STEPS
    assert all(0 <= s <= 3 * STEPS for s in server["staleness"])
    finals = [four[w][case][0]["final"] for w in (1, 2, 3)]
    for f in finals[1:]:  # after finish() every worker holds the server's final weights
        torch.testing.assert_close(f, finals[0])
    torch.testing.assert_close(finals[0], server["weights"])
    bytes_per_gradient = server["weights"].numel() * 8
    assert server["bytes_received"] == 3 * STEPS * bytes_per_gradient


@pytest.mark.parametrize("aware", [False, True])
def test_async_staleness_and_staleness_aware_lr_replayed(four, aware):
    server = four[0][f"ordered aware={aware}"][0]
    assert server["staleness"] == [0] * STEPS + [STEPS] + [0] * (STEPS - 1)
    want = replay_ordered(aware)
    torch.testing.assert_close(server["weights"], want)
    torch.testing.assert_close(four[2][f"ordered aware={aware}"][0]["final"], want)


def test_roles_and_shards_reject_bad_sizes():
    assert ps.roles(3, 1) == ([0], [1, 2])
    with pytest.raises(ValueError, match="at least one worker"):
        ps.roles(2, 2)
    assert ps.shard_bounds(10, 3) == [(0, 4), (4, 7), (7, 10)]
    with pytest.raises(ValueError, match="hold nothing"):
        ps.shard_bounds(2, 3)


# ---- failures: the run ends and names the rank ------------------------------------------------

class DyingServer(ps.ParameterServer):
    def _apply(self, grad, staleness):
        if self.version == 2:
            os._exit(3)  # no exception, no goodbye: the process is gone
        super()._apply(grad, staleness)


def dying(rank, world_size, who, how):
    """Server 0, workers 1 and 2; rank `who` dies (or goes silent) at the third step."""
    model = fresh()
    if rank == 0:
        server_class = DyingServer if who == 0 else ps.ParameterServer
        return server_class(model, [0], [1, 2], LR, mode="async", timeout=3).serve()
    x, y = batches(1)
    worker = ps.Worker(model, [0])
    worker.pull()
    for step in range(STEPS):
        if rank == who and step == 2:
            if how == "dies":
                os._exit(3)
            time.sleep(30)  # silent: the server's timeout (3 s) must end the run first
        model.zero_grad()
        F.nll_loss(model(x[step]), y[step]).backward()
        worker.push()
        worker.pull()
    return worker.finish()


@pytest.mark.parametrize("who,how", [(2, "dies"), (0, "dies"), (1, "is silent")])
def test_a_dead_or_silent_rank_is_named_and_the_run_ends(who, how):
    start = time.monotonic()
    with pytest.raises(RankError) as err:
        launch(dying, 3, who, how, backend="gloo", timeout=120)  # a hang would last >= 120 s
    seconds = time.monotonic() - start
    assert seconds < 60, f"took {seconds:.0f} s to end"  # ~5 s on a quiet machine
    if how == "dies":
        assert err.value.rank == who, str(err.value)
    else:  # the server notices first and names the silent worker
        assert f"no message from worker rank {who}" in str(err.value), str(err.value)


# ---- Hogwild ----------------------------------------------------------------------------------

def test_hogwild_trains_one_shared_model():
    train, test = synthetic(n=1200, seed=0), synthetic(n=300, seed=0, train=False)
    torch.manual_seed(0)
    model = MLP()
    before = evaluate(model, test)
    result = hogwild(model, train, processes=2, steps=40, batch_size=16, lr=0.1)
    after = evaluate(model, test)  # the parent's model: trained by the other processes
    assert len(result["losses"]) == 2 and all(len(l) == 40 for l in result["losses"])
    assert after["loss"] < 0.5 * before["loss"], (before, after)
    assert after["accuracy"] > 0.8, after
