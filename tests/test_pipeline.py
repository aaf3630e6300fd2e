"""dist_sgd.parallel.pipeline against one process and torch.distributed.pipelining, float64.

One launch() per world size (2, 3, 4) runs every case inside the ranks and returns a dict:
naive (GPipe, one micro-batch), GPipe and 1F1B for two SGD steps against one process on the
whole batch, and against torch's PipelineStage / ScheduleGPipe / Schedule1F1B on gloo; the
losses and outputs on the last stage; the micro-batches each stage holds; the order of 1F1B;
bad input refused on every stage alike; at world size 4 a 2 x 2 mesh, data parallel across
pipelines of two stages, against one process.
"""
import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed import pipelining as theirs

from dist_sgd.comm.collectives import all_reduce
from dist_sgd.parallel import pipeline as P
from dist_sgd.plumbing.launch import launch

BATCH, STEPS, LR = 12, 2, 0.1
SCHEDULES = [("naive", "ScheduleGPipe", 1), ("GPipe", "ScheduleGPipe", 4),
             ("1F1B", "Schedule1F1B", 4), ("1F1B m=6", "Schedule1F1B", 6)]


def make(frozen=False):
    torch.manual_seed(0)
    layers = [nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(),
              nn.Linear(8, 3)]
    if frozen:  # a frozen weight inside the second stage: its .grad stays None
        layers[4].weight.requires_grad_(False)
    return nn.Sequential(*layers).double()


def awkward(rank, p):
    """A frozen weight (1F1B at p stages), and one stage alone on a group of one rank (first
    and last at once): gradients against one process."""
    one = make()
    x, y = data(0)
    F.mse_loss(one(x), y).backward()
    mod = P.split_stages(make(frozen=True), p)[rank]
    sched = P.Schedule1F1B(P.PipelineStage(mod, rank, p, "cpu"), p + 1, F.mse_loss)
    sched.step(*((x[:p + 1],) if rank == 0 else ()), **({"target": y[:p + 1]} if rank == p - 1
                                                        else {}))
    ref = make(frozen=True)
    F.mse_loss(ref(x[:p + 1]), y[:p + 1]).backward()
    pairs = list(zip(mod.parameters(), P.split_stages(ref, p)[rank].parameters()))
    out = {"frozen": max([0.0] + [(a.grad - b.grad).abs().max().item() for a, b in pairs
                                  if b.grad is not None]),
           "frozen_none": all((a.grad is None) == (b.grad is None) for a, b in pairs)}
    alone = [dist.new_group([r]) for r in range(p)][rank]  # every rank makes every group
    solo = make()
    sched = P.ScheduleGPipe(P.PipelineStage(solo, 0, 1, "cpu", group=alone), 3, F.mse_loss)
    sched.step(x, target=y)
    out["one_stage"] = max((a.grad - b.grad).abs().max().item()
                           for a, b in zip(solo.parameters(), one.parameters()))
    return out


def data(step, n=BATCH):
    g = torch.Generator().manual_seed(step)
    return (torch.randn(n, 6, generator=g, dtype=torch.float64),
            torch.randn(n, 3, generator=g, dtype=torch.float64))


def one_process(p, stage):
    """Per step: this stage's gradients, the loss, the output; then the weights at the end."""
    model, out = make(), []
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        x, y = data(step)
        opt.zero_grad()
        pred = model(x)
        F.mse_loss(pred, y).backward()
        mine = P.split_stages(model, p)[stage]
        losses = [F.mse_loss(a, b) for a, b in zip(pred.chunk(4), y.chunk(4))]
        out.append(([q.grad.clone() for q in mine.parameters()], pred.detach(), losses))
        opt.step()
    return out, [q.detach().clone() for q in P.split_stages(model, p)[stage].parameters()]


def pipelined(lib, schedule, m, rank, p):
    stage = rank
    mod = P.split_stages(make(), p)[stage]
    pipe = lib.PipelineStage(mod, stage, p, torch.device("cpu"))
    sched = getattr(lib, schedule)(pipe, m, loss_fn=F.mse_loss)
    opt, grads, seen = torch.optim.SGD(mod.parameters(), lr=LR), [], []
    for step in range(STEPS):
        x, y = data(step)
        opt.zero_grad()
        losses = []
        args = (x,) if stage == 0 else ()
        kw = {"target": y, "losses": losses} if stage == p - 1 else {}
        out = sched.step(*args, **kw)
        grads.append([q.grad.clone() for q in mod.parameters()])
        seen.append((out, losses, getattr(sched, "peak_held", None)))
        opt.step()
    return grads, [q.detach().clone() for q in mod.parameters()], seen


def diff(a, b):
    return max([0.0] + [(x - y).abs().max().item() for x, y in zip(a, b)])


def refusals(rank, p):
    """Bad input, passed alike on every rank: (type, message) of what each raised."""
    out = {}

    def attempt(name, fn):
        try:
            fn()
            out[name] = None
        except (ValueError, TypeError) as e:
            out[name] = f"{type(e).__name__}: {e}"

    mod = P.split_stages(make(), p)[rank]
    stage = P.PipelineStage(mod, rank, p, "cpu")
    x, y = data(0, 10)  # 10 rows: 4 micro-batches do not divide them
    args, kw = ((x,) if rank == 0 else ()), ({"target": y} if rank == p - 1 else {})
    attempt("uneven", lambda: P.ScheduleGPipe(stage, 4, F.mse_loss).step(*args, **kw))
    attempt("few_microbatches", lambda: P.Schedule1F1B(stage, p - 1, F.mse_loss))
    no_target = {}
    attempt("no_target", lambda: P.ScheduleGPipe(stage, 2, F.mse_loss).step(
        *((data(0)[0],) if rank == 0 else ()), **no_target))
    attempt("too_many_stages", lambda: P.split_stages(make(), 8))
    attempt("wrong_index", lambda: P.PipelineStage(mod, (rank + 1) % p, p, "cpu"))
    empty = nn.Tanh() if rank == 1 else mod  # stage 1 has no parameters
    attempt("no_parameters", lambda: P.PipelineStage(empty, rank, p, "cpu"))
    x, y = data(0)  # the group still works: nothing half-sent
    kw = {"target": y} if rank == p - 1 else {}
    out["after"] = P.ScheduleGPipe(stage, 3, F.mse_loss).step(*((x,) if rank == 0 else ()), **kw)
    return out


def run(rank, p):
    res = {"orders": {m: P.one_f_one_b(rank, p, m) for m in (p, p + 3)}}
    expected, final = one_process(p, rank)
    for name, schedule, m in SCHEDULES:
        if schedule == "Schedule1F1B" and m < p:
            continue
        for who, lib in (("ours", P), ("torch", theirs)):
            grads, weights, seen = pipelined(lib, schedule, m, rank, p)
            res[(who, name)] = {
                "grads": max(diff(g, e[0]) for g, e in zip(grads, expected)),
                "weights": diff(weights, final), "held": seen[-1][2]}
            if rank == p - 1:
                res[(who, name)]["output"] = max(diff([s[0]], [e[1]])
                                                 for s, e in zip(seen, expected))
                if m == 4:
                    res[(who, name)]["losses"] = max(diff(s[1], e[2])
                                                     for s, e in zip(seen, expected))
            else:
                res[(who, name)]["none"] = all(s[0] is None and s[1] == [] for s in seen)
    res["refusals"] = refusals(rank, p)
    res["awkward"] = awkward(rank, p)
    if p == 4:  # 2 x 2: pipelines {0, 1}, {2, 3}; data parallel across {0, 2}, {1, 3}
        pp = [dist.new_group([0, 1]), dist.new_group([2, 3])][rank // 2]
        dp = [dist.new_group([0, 2]), dist.new_group([1, 3])][rank % 2]
        exp, fin = one_process(2, rank % 2)
        half = slice(BATCH // 2 * (rank // 2), BATCH // 2 * (rank // 2 + 1))
        grads, weights = _mesh(rank, pp, dp, half)
        res["mesh"] = {"grads": max(diff(g, e[0]) for g, e in zip(grads, exp)),
                       "weights": diff(weights, fin)}
    return res


def _mesh(rank, pp, dp, half):
    """A pipeline of two stages on pp, its gradients averaged over dp after every step."""
    mod = P.split_stages(make(), 2)[rank % 2]
    sched = P.Schedule1F1B(P.PipelineStage(mod, rank % 2, 2, "cpu", group=pp), 3, F.mse_loss)
    opt, grads = torch.optim.SGD(mod.parameters(), lr=LR), []
    for step in range(STEPS):
        x, y = (t[half] for t in data(step))
        opt.zero_grad()
        sched.step(*((x,) if rank % 2 == 0 else ()), **({"target": y} if rank % 2 else {}))
        for q in mod.parameters():
            all_reduce(q.grad, group=dp)
            q.grad /= 2
        grads.append([q.grad.clone() for q in mod.parameters()])
        opt.step()
    return grads, [q.detach().clone() for q in mod.parameters()]


@pytest.fixture(scope="module", params=[2, 3, 4])
def results(request):
    return request.param, launch(run, request.param)


def test_every_schedule_equals_one_process(results):
    """Gradients at every step and weights after two SGD steps: naive, GPipe, 1F1B."""
    p, res = results
    for rank, r in enumerate(res):
        for name, *_ in SCHEDULES:
            if ("ours", name) in r:
                got = r[("ours", name)]
                assert got["grads"] <= 1e-12 and got["weights"] <= 1e-12, (p, rank, name, got)


def test_every_schedule_equals_torch_pipelining(results):
    """torch's PipelineStage and schedules on gloo give the same as one process, so ours equal
    theirs (both within 1e-12 of the same numbers); the same keys ran on both."""
    p, res = results
    for rank, r in enumerate(res):
        for name, *_ in SCHEDULES:
            if ("ours", name) in r:
                ours, torch_ = r[("ours", name)], r[("torch", name)]
                assert torch_["grads"] <= 1e-12 and torch_["weights"] <= 1e-12, (p, rank, name)
                assert abs(ours["grads"] - torch_["grads"]) <= 2e-12


def test_loss_and_output_on_the_last_stage_only(results):
    p, res = results
    for name, *_ in SCHEDULES:
        if ("ours", name) not in res[0]:
            continue
        last = res[-1][("ours", name)]
        assert last["output"] <= 1e-12, name
        if "losses" in last:  # one per micro-batch, each the micro-batch's mean
            assert last["losses"] <= 1e-12, name
        assert all(r[("ours", name)]["none"] for r in res[:-1]), name


def test_held_activations_gpipe_m_1f1b_at_most_p(results):
    """GPipe holds every micro-batch; 1F1B holds p - s on stage s (at most p)."""
    p, res = results
    for s, r in enumerate(res):
        assert r[("ours", "GPipe")]["held"] == 4
        assert r[("ours", "naive")]["held"] == 1
        assert r[("ours", "1F1B m=6")]["held"] == p - s <= p


def test_one_f_one_b_order(results):
    """Warm-up p - 1 - s forwards, then forward/backward pairs, then the cool-down; every
    micro-batch once each way, each backward after its forward."""
    p, res = results
    for s, r in enumerate(res):
        for m, order in r["orders"].items():
            warm = p - 1 - s
            assert order[:warm] == [("F", i) for i in range(warm)]
            assert order[warm:warm + 2] == [("F", warm), ("B", 0)]
            assert sorted(order) == sorted([("F", i) for i in range(m)] +
                                           [("B", i) for i in range(m)])
            assert all(order.index(("F", i)) < order.index(("B", i)) for i in range(m))
            held = [0]
            for kind, _ in order:
                held.append(held[-1] + (1 if kind == "F" else -1))
            assert max(held) == p - s


def test_bad_input_refused_on_every_stage_alike(results):
    p, res = results
    wanted = {"uneven": "n_microbatches = 4 must divide the batch size",
              "few_microbatches": f"n_microbatches {p - 1} < {p} stages",
              "no_target": f"refused on stage {p - 1}: the last stage needs a loss_fn",
              "too_many_stages": "cannot split 7 layers into 8 stages",
              "wrong_index": "run one stage per rank",
              "no_parameters": "pipeline stage 1 has no parameters"}
    for rank, r in enumerate(res):
        m = r["refusals"]
        for name, text in wanted.items():
            assert m[name] and text in m[name] and m[name].startswith("ValueError"), (rank, m)
    same = ("uneven", "no_target", "no_parameters")  # collective refusals: every stage alike
    assert all(r["refusals"][k] == res[0]["refusals"][k] for r in res for k in same)
    assert res[-1]["refusals"]["after"] is not None  # the group still works afterwards


def test_two_by_two_mesh_equals_one_process(results):
    """4 ranks: two pipelines of two stages, data parallel across them (subgroups)."""
    p, res = results
    if p != 4:
        pytest.skip("the mesh runs at world size 4")
    for rank, r in enumerate(res):
        assert r["mesh"]["grads"] <= 1e-12 and r["mesh"]["weights"] <= 1e-12, (rank, r["mesh"])


def test_frozen_weight_and_a_stage_alone_on_its_own_group(results):
    """A frozen weight keeps .grad None and the others equal one process; a single-stage
    pipeline (first and last at once, group= of one rank) equals one process."""
    p, res = results
    for rank, r in enumerate(res):
        a = r["awkward"]
        assert a["frozen"] <= 1e-12 and a["frozen_none"] and a["one_stage"] <= 1e-12, (rank, a)
