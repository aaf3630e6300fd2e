"""Every CUDA path the project has, on one GPU, in under 3 minutes: `python3 -m pytest -q tests -m gpu`.

Without a GPU every test here skips (CI has none). With one GPU:
- launch() under NCCL places each rank on its own GPU (world size 1: one GPU is enough);
- our collectives on CUDA tensors over NCCL at world size 1 and over gloo at world size 2
  (two ranks sharing the one GPU: gloo moves CUDA tensors through host memory);
- our DistributedDataParallel on a CUDA module against torch's on the same batches;
- our DataParallel on one GPU against the module alone and torch's DataParallel.
Tests with 2+ GPUs live beside the CPU tests they extend (test_collectives, test_data_parallel).
"""
import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from dist_sgd.plumbing.launch import launch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
needs_nccl = pytest.mark.skipif(not dist.is_nccl_available(), reason="needs NCCL")


def _placement(rank, world_size):
    from dist_sgd.plumbing.rank import device
    here = device()
    t = torch.ones(3, device=here) * (rank + 1)
    dist.all_reduce(t)
    return str(here), dist.get_backend(), t.cpu().tolist()


@needs_nccl
def test_launch_puts_each_rank_on_its_gpu_under_nccl():
    [(where, backend, total)] = launch(_placement, 1, backend="nccl")
    assert (where, backend, total) == ("cuda:0", "nccl", [1.0, 1.0, 1.0])


def _collectives_on(rank, world_size, dev):
    """Ours against torch's on the same CUDA tensors: every all-reduce algorithm, broadcast,
    all_gather, reduce_scatter. Returns the largest difference per piece."""
    from dist_sgd.comm import collectives as ours
    dev = torch.device(dev)
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(1001, generator=gen).to(dev)  # odd size: uneven chunks
    out = {}
    for algorithm in ours.ALL_REDUCE_ALGORITHMS:
        a, b = x.clone(), x.clone()
        ours.all_reduce(a, algorithm=algorithm)
        dist.all_reduce(b)
        out[f"all_reduce {algorithm}"] = (a - b).abs().max().item()
    a, b = x.clone(), x.clone()
    ours.broadcast(a, src=0)
    dist.broadcast(b, src=0)
    out["broadcast"] = (a - b).abs().max().item()
    a = [torch.empty_like(x) for _ in range(world_size)]
    b = [torch.empty_like(x) for _ in range(world_size)]
    ours.all_gather(a, x)
    dist.all_gather(b, x)
    out["all_gather"] = max((p - q).abs().max().item() for p, q in zip(a, b))
    pieces = [x[i::world_size][:100].contiguous() for i in range(world_size)]
    a = torch.empty_like(pieces[0])
    ours.reduce_scatter(a, pieces)
    everyone = torch.stack(pieces)  # gloo has no CUDA reduce_scatter: the same sum, whole
    dist.all_reduce(everyone)
    out["reduce_scatter"] = (a - everyone[rank]).abs().max().item()
    return out


@needs_nccl
def test_our_collectives_on_cuda_tensors_over_nccl_world_size_1():
    [diffs] = launch(_collectives_on, 1, "cuda:0", backend="nccl")
    assert diffs and max(diffs.values()) == 0.0, diffs


def test_our_collectives_on_cuda_tensors_over_gloo_world_size_2():
    diffs = launch(_collectives_on, 2, "cuda:0", backend="gloo")
    for d in diffs:
        assert d and max(d.values()) < 1e-5, d


def _ddp_on(rank, world_size, dev, steps):
    """Our DDP and torch's on twin modules on `dev`, the same per-rank batches: gradients."""
    from dist_sgd.ddp.ddp import DistributedDataParallel
    dev = torch.device(dev)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(20, 33), nn.ReLU(), nn.Linear(33, 5)).to(dev)
    twin = nn.Sequential(nn.Linear(20, 33), nn.ReLU(), nn.Linear(33, 5)).to(dev)
    twin.load_state_dict(net.state_dict())
    ours = DistributedDataParallel(net, bucket_cap_mb=0.001)
    theirs = nn.parallel.DistributedDataParallel(twin, bucket_cap_mb=0.001)
    gen = torch.Generator().manual_seed(100 + rank)
    worst = 0.0
    for _ in range(steps):
        x = torch.randn(8, 20, generator=gen).to(dev)
        y = torch.randint(0, 5, (8,), generator=gen).to(dev)
        for model in (ours, theirs):
            model.zero_grad()
            F.cross_entropy(model(x), y).backward()
        for p, q in zip(net.parameters(), twin.parameters()):
            assert p.grad.device == dev
            worst = max(worst, (p.grad - q.grad).abs().max().item())
        with torch.no_grad():
            for p, q in zip(net.parameters(), twin.parameters()):
                p -= 0.1 * p.grad
                q -= 0.1 * q.grad
    dist.barrier()  # no rank leaves while a peer's reducer may still finish (torch 2.14)
    return worst


@needs_nccl
def test_our_ddp_on_a_cuda_module_equals_torch_ddp_nccl():
    assert launch(_ddp_on, 1, "cuda:0", 3, backend="nccl") == [0.0]


def test_our_ddp_on_a_cuda_module_equals_torch_ddp_gloo_world_size_2():
    for worst in launch(_ddp_on, 2, "cuda:0", 3, backend="gloo"):
        assert worst < 1e-6


def test_data_parallel_on_one_gpu():
    from dist_sgd.ddp.data_parallel import DataParallel
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(10, 7), nn.ReLU(), nn.Linear(7, 3)).cuda()
    x = torch.randn(6, 10, device="cuda")
    ours = DataParallel(module, device_ids=[0])
    theirs = nn.DataParallel(module, device_ids=[0])
    expected = module(x)
    got = ours(x)
    assert got.device.type == "cuda"
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    torch.testing.assert_close(theirs(x), expected, rtol=0, atol=0)
    got.sum().backward()
    grads = [p.grad.clone() for p in module.parameters()]
    module.zero_grad()
    expected.sum().backward()
    for g, p in zip(grads, module.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=0, atol=0)
