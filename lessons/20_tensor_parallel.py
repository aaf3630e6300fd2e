"""Lesson 20: tensor parallelism, one layer's weight split across ranks (Megatron-LM's way).

A pipeline (lesson 19) gives each rank whole layers. Tensor parallelism splits every layer:
each rank holds a slice of each weight and computes a slice of each product. An MLP
Y = gelu(X A) B splits with one message per pass (Shoeybi et al. 2019):

  A by columns (ColumnParallelLinear): rank r computes gelu(X A_r), no message: gelu acts
      element by element, so each rank's slice of the hidden layer is complete
  B by rows (RowParallelLinear): rank r computes gelu(X A_r) B_r, a partial sum of Y;
      one all-reduce adds them (the bias is added once, after it)

Two operators join them, each the other's backward (autograd Functions on our all_reduce):

  f  before the column layer   forward: identity      backward: all-reduce (each rank's
                                                      gradient of X covers its slice only)
  g  after the row layer       forward: all-reduce    backward: identity

Attention splits by heads the same way: q, k and v column-parallel (rank r computes its
heads), the output projection row-parallel. So a block (attention + MLP) costs two
all-reduces forward and two backward, each the size of the activations (batch x sequence x
width), whatever the model's size. Data parallelism sends the gradients instead, 2 x the
parameters per step: tensor parallelism pays when the layers are big and the activations
small, and it needs a fast link, as it talks inside every layer.

With 4 ranks as 2 x 2, tensor parallel within each pair and data parallel across them, each
collective runs on a subgroup (dist.new_group; torch's DeviceMesh makes the same groups).

Run:
    python lessons/20_tensor_parallel.py                 # 2 ranks, then 4 (and 2 x 2)
    python lessons/20_tensor_parallel.py --quick         # 2 ranks
    torchrun --standalone --nproc-per-node 4 lessons/20_tensor_parallel.py

Exercises:
  1. Swap f and g in ColumnParallelLinear and RowParallelLinear: which check fails first, and
     why does the forward output still look right at world size 1?
  2. A block of width 4096, sequence 2048, batch 8 in bfloat16 with 2 tensor-parallel ranks:
     how many bytes does each all-reduce carry, and how many does data parallelism send per
     step for the block's 12 x 4096^2 parameters?
  3. Write f and g, then the two parallel linears, checked against one process:
     python3 -m dist_sgd.course start tp_operators
     python3 -m dist_sgd.course start parallel_linear
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                               parallelize_module)

from dist_sgd.comm.collectives import all_reduce
from dist_sgd.parallel.tensor import (ColumnParallelLinear, CopyToParallel, ReduceFromParallel,
                                      RowParallelLinear)
from dist_sgd.plumbing.check import check, max_diff
from dist_sgd.plumbing.launch import launch, lesson_parser
from dist_sgd.plumbing.rank import device, log, under_torchrun
from dist_sgd.scale.costmodel import STRATEGIES, parallel_bytes

STEPS, LR = 3, 0.1


class Block(nn.Module):  # self-attention, then an MLP, each with a residual; float64

    def __init__(self, d, heads):
        super().__init__()
        torch.manual_seed(0)
        self.d, self.head = d, d // heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.double()

    def attend(self, q, k, v):  # as many heads as q has features / head size: all, or a slice
        b, s = q.shape[:2]
        q, k, v = (t.view(b, s, -1, self.head).transpose(1, 2) for t in (q, k, v))
        return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, s, -1)

    def forward(self, x):
        h = x + self.o(self.attend(self.q(x), self.k(x), self.v(x)))
        return h + self.fc2(F.gelu(self.fc1(h)))


# The same block split Megatron's way. q, k, v become one column-parallel layer (one f, as
# Megatron fuses them) whose rows are laid out so that rank r's slice is its heads' q, k, v.
class ParallelBlock(nn.Module):

    def __init__(self, block, group=None, log=None):
        super().__init__()
        p, fused = dist.get_world_size(group), nn.Linear(block.d, 3 * block.d).to(block.o.weight)
        with torch.no_grad():
            for name in ("weight", "bias"):
                slices = [getattr(getattr(block, n), name).chunk(p) for n in "qkv"]
                getattr(fused, name).copy_(torch.cat([s[r] for r in range(p) for s in slices]))
        self.qkv = ColumnParallelLinear.from_linear(fused, False, group, log)
        self.o = RowParallelLinear.from_linear(block.o, True, group, log)
        self.fc1 = ColumnParallelLinear.from_linear(block.fc1, False, group, log)
        self.fc2 = RowParallelLinear.from_linear(block.fc2, True, group, log)
        self.attend = block.attend

    def forward(self, x):
        h = x + self.o(self.attend(*self.qkv(x).chunk(3, dim=-1)))
        return h + self.fc2(F.gelu(self.fc1(h)))

    def full(self, group=None):  # every rank's slices put together, in Block's order
        p = dist.get_world_size(group)

        def gather(t, dim):
            parts = [torch.empty_like(t) for _ in range(p)]
            dist.all_gather(parts, t.detach().contiguous(), group=group)
            return torch.cat(parts, dim)
        w, b = (gather(t, 0).unflatten(0, (p, 3, -1)) for t in (self.qkv.weight, self.qkv.bias))
        qkv = [t for i in range(3) for t in (w[:, i].flatten(0, 1), b[:, i].flatten())]
        return qkv + [gather(self.o.weight, 1), self.o.bias, gather(self.fc1.weight, 0),
                      gather(self.fc1.bias, 0), gather(self.fc2.weight, 1), self.fc2.bias]


def train(model, xs, after_backward=lambda: None):
    opt, outs = torch.optim.SGD(model.parameters(), lr=LR), []
    for x in xs:
        opt.zero_grad()
        outs.append(model(x.clone().requires_grad_()))  # as from an earlier layer: f's too
        outs[-1].square().mean().backward()
        after_backward()
        opt.step()
    return outs


def by_hand(rank, p, x):  # the MLP, A's columns and B's rows sliced by hand, joined by f and g
    torch.manual_seed(1)
    a, b = (torch.randn(*s, dtype=torch.float64).to(x.device) for s in ((8, 4 * p), (4 * p, 8)))
    mine = [t.chunk(p, k)[rank].clone().requires_grad_() for t, k in ((a, 1), (b, 0))]
    y = ReduceFromParallel.apply(F.gelu(CopyToParallel.apply(x, None) @ mine[0]) @ mine[1])
    y.sum().backward()
    (F.gelu(x @ a.requires_grad_()) @ b.requires_grad_()).sum().backward()
    grads = [mine[0].grad, mine[1].grad], [a.grad.chunk(p, 1)[rank], b.grad.chunk(p, 0)[rank]]
    return {"by hand: Y = gelu(X A) B, A by columns, B by rows, vs one process":
            max_diff(y, F.gelu(x @ a) @ b),
            "by hand: gradients of A's and B's slices vs one process": max_diff(*grads)}


def run(rank, p, args):
    d, heads, n = (8, 4, 4) if args.quick else (64, 8, 8)
    g, dev = torch.Generator().manual_seed(0), device()  # NCCL: this rank's GPU
    xs = [torch.randn(n, 16, d, generator=g, dtype=torch.float64).to(dev) for _ in range(STEPS)]
    out = by_hand(rank, p, xs[0][0, :, :8])
    one, ours = Block(d, heads).to(dev), ParallelBlock(Block(d, heads).to(dev), log=(calls := []))
    out["block: outputs at every step vs one process"] = max_diff(train(ours, xs), train(one, xs))
    out[f"block: weights after {STEPS} steps vs one process"] = max_diff(ours.full(), one)
    plan = {n: ColwiseParallel() for n in ("q", "k", "v", "fc1")} | {"o": RowwiseParallel(),
                                                                      "fc2": RowwiseParallel()}
    torch_tp = parallelize_module(Block(d, heads).to(dev), init_device_mesh(dev.type, (p,)), plan)
    train(torch_tp, xs)
    out[f"block: weights after {STEPS} steps vs torch's parallelize_module"] = max_diff(
        ours.full(), [t.full_tensor() for t in torch_tp.parameters()])
    if p == 4:  # 2 x 2: tensor parallel within {0, 1} and {2, 3}, data parallel across
        tp = [dist.new_group([0, 1]), dist.new_group([2, 3])][rank // 2]
        dp = [dist.new_group([0, 2]), dist.new_group([1, 3])][rank % 2]
        mesh = init_device_mesh(dev.type, (2, 2), mesh_dim_names=("dp", "tp"))
        out["mesh: DeviceMesh's groups vs new_group's (1 where one differs)"] = float(any(
            dist.get_process_group_ranks(mesh.get_group(k)) != dist.get_process_group_ranks(v)
            for k, v in (("tp", tp), ("dp", dp))))
        model = ParallelBlock(Block(d, heads).to(dev), group=tp)

        def average():  # each replica saw half the batch: the mean of the two means
            for q in model.parameters():
                all_reduce(q.grad, group=dp)
                q.grad /= 2
        train(model, [x[n // 2 * (rank // 2):][:n // 2] for x in xs], average)  # its half
        out[f"2 x 2 mesh: weights after {STEPS} steps vs one process"] = max_diff(
            model.full(tp), one)
    one_step = [(c["op"], c["pass"], c["bytes"]) for c in calls[:len(calls) // STEPS]]
    return out, one_step, n * 16 * d * 8, sum(q.numel() for q in one.parameters())


def report(p, results):
    for name in results[0][0]:
        log(check(name, max(r[0][name] for r in results), 1e-12))
    _, calls, size, params = results[0]
    for pass_ in ("forward", "backward"):
        mine = [c for c in calls if c[1] == pass_]
        log(f"all-reduces per block, {pass_}: {len(mine)} ({', '.join(c[0] for c in mine)}), "
            f"{mine[0][2]:,} bytes each = batch x sequence x width x 8 = {size:,}")
    log(f"bytes each rank sends per step for this block ({params:,} parameters), on paper: " +
        ", ".join(f"{s} {parallel_bytes(s, params, 1, size // 8, p, 8):,.0f}" for s in STRATEGIES))


def main():
    args = lesson_parser(__doc__, world_size=[2, 4]).parse_args()
    sizes = [2] if args.quick and args.world_size == [2, 4] else args.world_size
    sizes = [int(os.environ["WORLD_SIZE"])] if under_torchrun() else sizes  # its group, made
    for ws in sizes:
        log(f"\n=== {ws} tensor-parallel ranks" + (" (and 2 x 2)" if ws == 4 else "") + " ===")
        results = launch(run, ws, args, backend=args.backend)
        if results is not None:
            report(ws, results)
    log("\n" + __doc__[__doc__.index("Exercises:"):].rstrip())


if __name__ == "__main__":
    main()
