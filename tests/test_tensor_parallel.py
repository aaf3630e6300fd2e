"""dist_sgd.parallel.tensor against one process and torch's parallelize_module (DTensor), float64.

One launch() per world size (1-4) runs every case inside the ranks: f and g alone (their
forward and backward against what they promise), ColumnParallelLinear and RowParallelLinear
with gather_output / input_is_parallel both ways, an attention + MLP block split Megatron's
way for two SGD steps (outputs, gradients, weights) against one process and against torch's
ColwiseParallel / RowwiseParallel, the all-reduces counted (2 forward, 2 backward) with their
bytes, sizes that do not divide refused, and at world size 4 a 2 x 2 mesh (data parallel
across tensor-parallel pairs, DeviceMesh's groups the same as new_group's).
"""
import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                               parallelize_module)

from dist_sgd.comm.collectives import all_reduce
from dist_sgd.parallel import tensor as T
from dist_sgd.plumbing.launch import launch
from dist_sgd.scale.costmodel import parallel_bytes

D, HEADS, HIDDEN, STEPS, LR = 24, 12, 36, 2, 0.1  # every size divides by 2, 3 and 4


class Block(nn.Module):
    """Self-attention, then an MLP, each with a residual (no norms: they stay whole anyway)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.q, self.k, self.v, self.o = (nn.Linear(D, D) for _ in range(4))
        self.fc1, self.fc2 = nn.Linear(D, HIDDEN), nn.Linear(HIDDEN, D)
        self.double()

    def attend(self, q, k, v):  # any number of heads: D // HEADS features each
        b, s = q.shape[:2]
        q, k, v = (t.view(b, s, -1, D // HEADS).transpose(1, 2) for t in (q, k, v))
        return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, s, -1)

    def forward(self, x):
        h = x + self.o(self.attend(self.q(x), self.k(x), self.v(x)))
        return h + self.fc2(F.gelu(self.fc1(h)))


class ParallelBlock(nn.Module):
    """The same block, Megatron's way: q, k, v fused into one column-parallel layer whose rows
    are laid out so that rank r's slice is its heads' q, k and v; o and fc2 row-parallel."""

    def __init__(self, block, group=None, log=None):
        super().__init__()
        p = dist.get_world_size(group)
        fused = nn.Linear(D, 3 * D).double()
        with torch.no_grad():
            for name in ("weight", "bias"):
                parts = [getattr(block, n).__getattr__(name).chunk(p) for n in "qkv"]
                getattr(fused, name).copy_(torch.cat([t for r in range(p) for t in
                                                      (parts[0][r], parts[1][r], parts[2][r])]))
        self.qkv = T.ColumnParallelLinear.from_linear(fused, False, group, log)
        self.o = T.RowParallelLinear.from_linear(block.o, True, group, log)
        self.fc1 = T.ColumnParallelLinear.from_linear(block.fc1, False, group, log)
        self.fc2 = T.RowParallelLinear.from_linear(block.fc2, True, group, log)
        self.attend = block.attend

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        h = x + self.o(self.attend(q, k, v))
        return h + self.fc2(F.gelu(self.fc1(h)))


def local(block, p, r, grad=False):
    """One process's tensors, cut as rank r of p holds them (ParallelBlock's order)."""
    get = (lambda t: t.grad) if grad else (lambda t: t.detach())
    out = []
    for name in ("weight", "bias"):
        out.append(torch.cat([get(getattr(block, n).__getattr__(name)).chunk(p)[r]
                              for n in "qkv"]))
    out += [get(block.o.weight).chunk(p, dim=1)[r], get(block.o.bias)]
    out += [get(block.fc1.weight).chunk(p)[r], get(block.fc1.bias).chunk(p)[r]]
    out += [get(block.fc2.weight).chunk(p, dim=1)[r], get(block.fc2.bias)]
    return [out[0], out[1]] + out[2:]


def data(step, n=4):
    g = torch.Generator().manual_seed(step)
    return torch.randn(n, 5, D, generator=g, dtype=torch.float64)


def diff(a, b):
    return max([0.0] + [(x - y).abs().max().item() for x, y in zip(a, b)])


def train(model, xs, after_backward=lambda m: None):
    opt, seen = torch.optim.SGD(model.parameters(), lr=LR), []
    for x in xs:
        opt.zero_grad()
        out = model(x.clone().requires_grad_())  # as if from an earlier layer: f runs too
        out.square().mean().backward()
        after_backward(model)
        seen.append((out.detach(), [q.grad.clone() for q in model.parameters()]))
        opt.step()
    return seen


def operators(rank, p):
    """f and g alone: forward and backward against what each promises."""
    x = torch.randn(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(rank))
    a = x.clone().requires_grad_()
    y = T.CopyToParallel.apply(a, None)
    (y * (rank + 1)).sum().backward()  # each rank's own upstream gradient: rank + 1
    b = x.clone().requires_grad_()
    z = T.ReduceFromParallel.apply(b, None)
    everyone = x.clone()
    dist.all_reduce(everyone)
    (z * (rank + 1)).sum().backward()
    total = sum(range(1, p + 1))
    return {"f forward": diff([y], [x]), "f backward": diff([a.grad], [torch.full_like(x, total)]),
            "g forward": diff([z], [everyone]), "g backward": diff([b.grad],
                                                                   [torch.full_like(x, rank + 1)])}


def linears(rank, p):
    """Column then row, both ways of joining, against one nn.Linear pair."""
    torch.manual_seed(1)
    first, second = nn.Linear(5, 4 * p).double(), nn.Linear(4 * p, 3).double()
    x = torch.randn(6, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    x.requires_grad_()
    second(F.gelu(first(x))).sum().backward()
    out = {}
    for gathered in (True, False):
        col = T.ColumnParallelLinear.from_linear(first, gather_output=gathered)
        row = T.RowParallelLinear.from_linear(second, input_is_parallel=not gathered)
        xx = x.detach().clone().requires_grad_()
        y = row(F.gelu(col(xx)))
        y.sum().backward()
        ref = [first.weight.grad.chunk(p)[rank], first.bias.grad.chunk(p)[rank],
               second.weight.grad.chunk(p, dim=1)[rank], second.bias.grad]
        out[f"gather_output={gathered}"] = max(
            diff([y], [second(F.gelu(first(x)))]), diff([xx.grad], [x.grad]),
            diff([col.weight.grad, col.bias.grad, row.weight.grad, row.bias.grad], ref))
    return out


def refusals(p):
    out = {}
    for name, fn in {"column": lambda: T.ColumnParallelLinear(4, 4 * p + 1),
                     "row": lambda: T.RowParallelLinear(4 * p + 1, 4)}.items():
        try:
            fn()
            out[name] = None
        except ValueError as e:
            out[name] = str(e)
    return out


def run(rank, p):
    res = {"operators": operators(rank, p), "linears": linears(rank, p)}
    if p > 1:
        res["refusals"] = refusals(p)
    xs = [data(s) for s in range(STEPS)]
    one = Block()
    seen_one = []
    opt = torch.optim.SGD(one.parameters(), lr=LR)
    for x in xs:
        opt.zero_grad()
        out = one(x)
        out.square().mean().backward()
        seen_one.append((out.detach(), local(one, p, rank, grad=True)))
        opt.step()
    log = []
    ours = ParallelBlock(Block(), log=log)
    seen = train(ours, xs)
    res["block"] = {"outputs": max(diff([a[0]], [b[0]]) for a, b in zip(seen, seen_one)),
                    "grads": max(diff(a[1], b[1]) for a, b in zip(seen, seen_one)),
                    "weights": diff(list(ours.parameters()), local(one, p, rank))}
    per_step = log[:len(log) // STEPS]
    res["log"] = [(e["op"], e["pass"], e["bytes"]) for e in per_step]
    if p > 1:  # torch's DTensor tensor parallelism on the same block
        mesh = init_device_mesh("cpu", (p,))
        theirs = parallelize_module(Block(), mesh, {n: ColwiseParallel() for n in ("q", "k", "v",
                                                                                      "fc1")} |
                                    {"o": RowwiseParallel(), "fc2": RowwiseParallel()})
        seen_t = train(theirs, xs)
        # torch's local shards, in ParallelBlock's order (q, k, v fused as ours are)
        shard = {n: [t.to_local() for t in getattr(theirs, n).parameters()]
                 for n in ("q", "k", "v", "o", "fc1", "fc2")}
        weights = [torch.cat([shard[n][0] for n in "qkv"]), torch.cat([shard[n][1] for n in "qkv"]),
                   *shard["o"], *shard["fc1"], *shard["fc2"]]
        res["torch"] = {"outputs": max(diff([a[0]], [b[0]]) for a, b in zip(seen, seen_t)),
                        "weights": diff(list(ours.parameters()), weights)}
    if p == 4:
        res["mesh"] = mesh2x2(rank, xs, seen_one)
    return res


def mesh2x2(rank, xs, seen_one):
    """Tensor parallel within {0, 1} and {2, 3}, data parallel across {0, 2} and {1, 3}."""
    tp = [dist.new_group([0, 1]), dist.new_group([2, 3])][rank // 2]
    dp = [dist.new_group([0, 2]), dist.new_group([1, 3])][rank % 2]
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    same = (dist.get_process_group_ranks(mesh.get_group("tp")) == dist.get_process_group_ranks(tp)
            and dist.get_process_group_ranks(mesh.get_group("dp"))
            == dist.get_process_group_ranks(dp))
    model = ParallelBlock(Block(), group=tp)

    def average(m):
        for q in m.parameters():
            all_reduce(q.grad, group=dp)
            q.grad /= 2
    half = slice(2 * (rank // 2), 2 * (rank // 2) + 2)  # this replica's half of the batch
    train(model, [x[half] for x in xs], average)
    one = Block()
    train(one, xs)
    return {"same_groups": same, "weights": diff(list(model.parameters()),
                                                  local(one, 2, rank % 2))}


@pytest.fixture(scope="module", params=[1, 2, 3, 4])
def results(request):
    return request.param, launch(run, request.param)


def test_f_and_g_forward_and_backward(results):
    """f: identity forward, all-reduce backward; g: all-reduce forward, identity backward."""
    p, res = results
    for rank, r in enumerate(res):
        assert all(v <= 1e-12 for v in r["operators"].values()), (p, rank, r["operators"])


def test_column_then_row_linear_equal_one_process(results):
    """Outputs, input gradients and weight gradients (this rank's slice), both ways."""
    p, res = results
    for rank, r in enumerate(res):
        assert all(v <= 1e-12 for v in r["linears"].values()), (p, rank, r["linears"])


def test_block_equals_one_process(results):
    """Attention + MLP split Megatron's way: outputs, gradients, weights after two steps."""
    p, res = results
    for rank, r in enumerate(res):
        assert all(v <= 1e-12 for v in r["block"].values()), (p, rank, r["block"])


def test_block_equals_torch_parallelize_module(results):
    p, res = results
    if p == 1:
        pytest.skip("torch's tensor parallelism needs a mesh of two ranks or more")
    for rank, r in enumerate(res):
        assert all(v <= 1e-12 for v in r["torch"].values()), (p, rank, r["torch"])


def test_two_all_reduces_forward_two_backward_per_block(results):
    """g after o and fc2 in forward, f before qkv and fc1 in backward, each of the
    activations' size: batch x sequence x width x 8 bytes."""
    p, res = results
    for r in res:
        ops = sorted((op, pass_) for op, pass_, _ in r["log"])
        assert ops == [("f", "backward")] * 2 + [("g", "forward")] * 2, r["log"]
        assert all(nbytes == 4 * 5 * D * 8 for *_, nbytes in r["log"]), r["log"]
        # what the ring sends of them, per rank, is the cost model's figure for one block
        sent = sum(2 * (p - 1) / p * nbytes for *_, nbytes in r["log"])
        assert sent == parallel_bytes("tensor", 0, 1, 4 * 5 * D, p, elem=8)


def test_sizes_that_do_not_divide_are_refused(results):
    p, res = results
    if p == 1:
        pytest.skip("every size divides by 1")
    for r in res:
        assert f"out_features = {4 * p + 1} is not divisible by the tensor-parallel size" \
            in r["refusals"]["column"]
        assert f"in_features = {4 * p + 1} is not divisible" in r["refusals"]["row"]


def test_two_by_two_mesh_equals_one_process(results):
    p, res = results
    if p != 4:
        pytest.skip("the mesh runs at world size 4")
    for rank, r in enumerate(res):
        assert r["mesh"]["same_groups"], rank
        assert r["mesh"]["weights"] <= 1e-12, (rank, r["mesh"])
