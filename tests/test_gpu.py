"""Every CUDA path the project has, on one GPU, in under 3 minutes: `python3 -m pytest -q tests -m gpu`.

Without a GPU every test here skips (CI has none). With one GPU:
- launch() under NCCL places each rank on its own GPU (world size 1: one GPU is enough);
- our collectives on CUDA tensors over NCCL at world size 1 and over gloo at world size 2
  (two ranks sharing the one GPU: gloo moves CUDA tensors through host memory);
- our DistributedDataParallel on a CUDA module against torch's on the same batches;
- our DataParallel on one GPU against the module alone and torch's DataParallel;
- our FullyShardedDataParallel (ZeRO-3 and ZeRO-2) on a CUDA module against one process on
  the global batch, over NCCL at world size 1 and over gloo at world size 2 (our collectives:
  gloo has no CUDA reduce_scatter);
- our ShardedOptimizer (ZeRO-1, both schemes) on CUDA parameters against the plain optimizer
  after average_gradients, over NCCL at world size 1 and over gloo at world size 2;
- our SyncBatchNorm against torch's nn.SyncBatchNorm (which runs on GPUs only) on CUDA
  tensors, over gloo at world size 2 (with 2+ GPUs over NCCL: tests/test_large_batch.py).
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


class _Dense(nn.Module):
    """As test_fsdp's: 7 -> 13 -> LayerNorm -> 5 (no bias) -> 3, no size divisible by 2."""

    def __init__(self):
        super().__init__()
        self.fc1, self.norm = nn.Linear(7, 13), nn.LayerNorm(13)
        self.fc2, self.head = nn.Linear(13, 5, bias=False), nn.Linear(5, 3)

    def forward(self, x):
        return self.head(torch.tanh(self.fc2(torch.tanh(self.norm(self.fc1(x))))))


def _global_batch(step, world_size, dev, per_rank=4):
    """Every rank's batch of this step, stacked: rank r's is rows [r * per_rank, ...)."""
    g = torch.Generator().manual_seed(100 + step)
    n = per_rank * world_size
    return torch.randn(n, 7, generator=g).to(dev), torch.randn(n, 3, generator=g).to(dev)


def _fsdp_on(rank, world_size, dev, collectives, steps=3):
    """Our FSDP (ZeRO-3, ZeRO-2) with Adam on `dev` against one process on the global batch:
    the largest difference of the full parameters after each step, per mode."""
    from dist_sgd.shard.fsdp import FullyShardedDataParallel
    dev, worst = torch.device(dev), {}
    for mode, reshard in (("ZeRO-3", True), ("ZeRO-2", False)):
        torch.manual_seed(0)
        ref = _Dense().to(dev)
        torch.manual_seed(0)
        model = FullyShardedDataParallel(_Dense().to(dev), reshard_after_forward=reshard,
                                         collectives=collectives)
        assert all(p.device == dev for p in model.parameters()), "a shard left the GPU"
        ref_opt = torch.optim.Adam(ref.parameters(), lr=0.01)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        worst[mode] = 0.0
        for step in range(steps):
            x, y = _global_batch(step, world_size, dev)
            ref_opt.zero_grad()
            F.mse_loss(ref(x), y).backward()
            ref_opt.step()
            mine = slice(rank * 4, (rank + 1) * 4)
            opt.zero_grad()
            F.mse_loss(model(x[mine]), y[mine]).backward()
            opt.step()
            full = model.gather_full_params()
            for name, p in ref.named_parameters():
                assert full[name].device == dev, f"{name} gathered on {full[name].device}"
                worst[mode] = max(worst[mode], (full[name] - p).abs().max().item())
    dist.barrier()
    return worst


@needs_nccl
def test_our_fsdp_on_a_cuda_module_equals_one_process_nccl():
    [worst] = launch(_fsdp_on, 1, "cuda:0", "torch", backend="nccl")
    assert worst.keys() == {"ZeRO-3", "ZeRO-2"} and max(worst.values()) < 1e-6, worst


def test_our_fsdp_on_a_cuda_module_equals_one_process_gloo_world_size_2():
    for worst in launch(_fsdp_on, 2, "cuda:0", "ours", backend="gloo"):
        assert worst.keys() == {"ZeRO-3", "ZeRO-2"} and max(worst.values()) < 1e-5, worst


def _zero_on(rank, world_size, dev, collectives, steps=3):
    """ShardedOptimizer(Adam) in both schemes on `dev` against plain Adam after
    average_gradients, the same per-rank batches: the largest parameter difference."""
    from dist_sgd.sgd.sync import average_gradients
    from dist_sgd.shard.zero import ShardedOptimizer
    dev, worst = torch.device(dev), {}
    for scheme in ("broadcast", "all_gather"):
        torch.manual_seed(0)
        ref = _Dense().to(dev)
        model = _Dense().to(dev)
        model.load_state_dict(ref.state_dict())
        ref_opt = torch.optim.Adam(ref.parameters(), lr=0.01)
        opt = ShardedOptimizer(model.parameters(), torch.optim.Adam, scheme=scheme,
                               collectives=collectives, lr=0.01)
        worst[scheme] = 0.0
        for step in range(steps):
            x, y = _global_batch(step, world_size, dev)
            mine = slice(rank * 4, (rank + 1) * 4)
            for m, o in ((ref, ref_opt), (model, opt)):
                o.zero_grad()
                F.mse_loss(m(x[mine]), y[mine]).backward()
            average_gradients(ref)  # the plain optimizer: data parallelism by hand
            ref_opt.step()
            opt.step()  # reduces the gradients itself
            for p, q in zip(model.parameters(), ref.parameters()):
                assert p.device == dev
                worst[scheme] = max(worst[scheme], (p - q).abs().max().item())
    dist.barrier()
    return worst


@needs_nccl
def test_our_zero_on_cuda_parameters_equals_the_plain_optimizer_nccl():
    [worst] = launch(_zero_on, 1, "cuda:0", "torch", backend="nccl")
    assert worst.keys() == {"broadcast", "all_gather"} and max(worst.values()) < 1e-6, worst


def test_our_zero_on_cuda_parameters_equals_the_plain_optimizer_gloo_world_size_2():
    for worst in launch(_zero_on, 2, "cuda:0", "ours", backend="gloo"):
        assert worst.keys() == {"broadcast", "all_gather"} and max(worst.values()) < 1e-5, worst


def _syncbn_against_torchs(rank, world_size, dev):
    """Ours and torch's SyncBatchNorm on the same uneven local batches of CUDA tensors: the
    largest difference in outputs, input and weight gradients and running statistics."""
    from dist_sgd.large_batch.syncbn import SyncBatchNorm
    from dist_sgd.plumbing.rank import device
    dev = torch.device(dev) if dev else device()  # None: this rank's own GPU under NCCL
    ours, theirs = SyncBatchNorm(5).to(dev), nn.SyncBatchNorm(5).to(dev)
    worst = 0.0
    for step in range(2):
        gen = torch.Generator().manual_seed(10 * step)
        x = torch.randn(7, 5, 3, generator=gen).to(dev) * 2 + 1
        w = torch.randn(7, 5, 3, generator=gen).to(dev)
        mine = slice(0, 3) if rank == 0 else slice(3, 7)  # uneven: 3 and 4 items
        a, b = x[mine].clone().requires_grad_(), x[mine].clone().requires_grad_()
        try:
            yt = theirs(b)
        except RuntimeError as e:  # torch's may need collectives gloo lacks on CUDA
            return f"torch's SyncBatchNorm refused: {str(e).splitlines()[0]}"
        (yt * w[mine]).sum().backward()
        ya = ours(a)
        (ya * w[mine]).sum().backward()
        pairs = [(ya, yt), (a.grad, b.grad), (ours.weight.grad, theirs.weight.grad),
                 (ours.bias.grad, theirs.bias.grad), (ours.running_mean, theirs.running_mean),
                 (ours.running_var, theirs.running_var)]
        worst = max([worst] + [(p - q).abs().max().item() for p, q in pairs])
    dist.barrier()
    return worst


def test_our_syncbn_equals_torchs_on_cuda_gloo_world_size_2():
    results = launch(_syncbn_against_torchs, 2, "cuda:0", backend="gloo")
    if any(isinstance(r, str) for r in results):
        pytest.skip(next(r for r in results if isinstance(r, str)))
    assert max(results) < 1e-5, results
