"""Every CUDA path the project has, on GPUs: `python3 -m pytest -q tests -m gpu`.

Without a GPU every test here skips (CI has none). With one GPU (the checkout on PYTHONPATH is
enough: nothing needs installing; torch 2.11 and 2.14 alike):
- every lesson at --quick under torchrun with one process on the GPU (NCCL), six at a time;
  a lesson that cannot run there says so in one line (CPU only, or world size 1 refused);
- launch() under NCCL places each rank on its own GPU (world size 1: one GPU is enough);
- our collectives (and the textbook's) on CUDA tensors over NCCL at world size 1 and over
  gloo at world size 2 (two ranks sharing the one GPU: gloo's send/recv read host memory, so
  comm/wire stages CUDA tensors through host copies, as torch's gloo collectives do);
- our DistributedDataParallel on a CUDA module against torch's on the same batches;
- our DataParallel on one GPU against the module alone and torch's DataParallel;
- our FullyShardedDataParallel (ZeRO-3 and ZeRO-2) on a CUDA module against one process on
  the global batch, over NCCL at world size 1 and over gloo at world size 2 (our collectives:
  gloo has no CUDA reduce_scatter);
- our ShardedOptimizer (ZeRO-1, both schemes) on CUDA parameters against the plain optimizer
  after average_gradients, over NCCL at world size 1 and over gloo at world size 2;
- our SyncBatchNorm against torch's nn.SyncBatchNorm (which runs on GPUs only) on CUDA
  tensors, over gloo at world size 2 (with 2+ GPUs over NCCL: tests/test_large_batch.py);
- our PowerSGD and fp16 hooks against torch's on CUDA gradients; the pipeline, tensor
  parallelism and the parameter server on CUDA tensors over gloo at world size 2; a
  checkpoint saved from a GPU loaded on the CPU and back;
- with 2+ GPUs: collectives, DDP, FSDP and ZeRO-1 again over NCCL at world size 2, one GPU
  per rank (more tests with 2+ GPUs live beside the CPU tests they extend).
TF32 is off in every rank here (exact_float32): the tolerances are a CPU's float32 rounding.
"""
import concurrent.futures
import glob
import os
import subprocess
import sys
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from dist_sgd.plumbing.launch import launch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
needs_nccl = pytest.mark.skipif(not dist.is_nccl_available(), reason="needs NCCL")
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
needs_2_gpus = pytest.mark.skipif(GPUS < 2 or not dist.is_nccl_available(),
                                  reason="needs 2 GPUs and NCCL")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _here(dev):
    """The device a rank computes on: `dev` when named ("cuda:0": ranks sharing one GPU over
    gloo), else this rank's own (cuda:LOCAL_RANK under NCCL); TF32 off for the comparisons."""
    from dist_sgd.plumbing.check import exact_float32
    from dist_sgd.plumbing.rank import device
    exact_float32()
    return torch.device(dev) if dev else device()


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
    from dist_sgd.comm import textbook
    dev = _here(dev)
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
    a, b = x.clone(), x.clone()  # the textbook's, on torch's own send/recv (wire.through_host)
    textbook.broadcast(a, 0)
    dist.broadcast(b, 0)
    out["textbook broadcast"] = (a - b).abs().max().item()
    a = [torch.empty_like(x) for _ in range(world_size)]
    textbook.all_gather(a, x)
    out["textbook all_gather"] = max((p - q).abs().max().item() for p, q in zip(a, b_list(x)))
    a = torch.empty_like(pieces[0])
    textbook.reduce_scatter(a, pieces)
    out["textbook reduce_scatter"] = (a - everyone[rank]).abs().max().item()
    assert all(t.device == dev for t in [a, x]), "a result left the GPU"
    return out


def b_list(x):
    """torch's all_gather of x: every rank's, by rank."""
    out = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(out, x)
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
    dev = _here(dev)
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
    dev, worst = _here(dev), {}
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
    dev, worst = _here(dev), {}
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


# ---- with 2+ GPUs: NCCL at world size 2, one GPU per rank ------------------------------------

@needs_2_gpus
def test_our_collectives_over_nccl_world_size_2():
    for d in launch(_collectives_on, 2, None, backend="nccl"):
        assert d and max(d.values()) < 1e-5, d


@needs_2_gpus
def test_our_ddp_equals_torch_ddp_over_nccl_world_size_2():
    for worst in launch(_ddp_on, 2, None, 3, backend="nccl"):
        assert worst < 1e-6


@needs_2_gpus
def test_our_fsdp_and_zero_over_nccl_world_size_2():
    for worst in launch(_fsdp_on, 2, None, "torch", backend="nccl"):
        assert max(worst.values()) < 1e-5, worst
    for worst in launch(_zero_on, 2, None, "torch", backend="nccl"):
        assert max(worst.values()) < 1e-5, worst


# ---- the other pieces on CUDA tensors, two ranks sharing one GPU over gloo -------------------

def _hooks_on(rank, world_size, dev, steps=4):
    """Our fp16 and PowerSGD hooks against torch's on the same CUDA gradients, step by step."""
    import torch.distributed.algorithms.ddp_comm_hooks.default_hooks as torch_default
    import torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook as torch_powersgd
    from dist_sgd.ddp import compress
    from dist_sgd.ddp.grad_bucket import GradBucket
    dev = _here(dev)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 33), nn.ReLU(), nn.Linear(33, 5)).to(dev)
    states = compress.PowerSGDState(None, 2, 2), torch_powersgd.PowerSGDState(None, 2, 2)
    gen, worst = torch.Generator().manual_seed(rank), {"fp16": 0.0, "powerSGD": 0.0}
    for _ in range(steps):
        model.zero_grad()
        model(torch.randn(8, 20, generator=gen).to(dev)).square().mean().backward()
        grads = [p.grad for p in model.parameters()]
        a = compress.fp16_compress_hook(None, GradBucket.of(grads)).wait()
        b = torch_default.fp16_compress_hook(None, GradBucket.of(grads)).wait()
        assert a.device == dev, f"our fp16 hook's result on {a.device}"
        worst["fp16"] = max(worst["fp16"], (a - b).abs().max().item())
        a = compress.powerSGD_hook(states[0], GradBucket.of(grads)).wait()
        b = torch_powersgd.powerSGD_hook(states[1], GradBucket.of(grads)).wait()
        assert a.device == dev, f"our PowerSGD hook's result on {a.device}"
        worst["powerSGD"] = max(worst["powerSGD"], (a - b).abs().max().item())
    dist.barrier()
    return worst


def test_our_compression_hooks_equal_torchs_on_cuda_gloo_world_size_2():
    for worst in launch(_hooks_on, 2, "cuda:0", backend="gloo"):
        assert worst["fp16"] == 0.0 and worst["powerSGD"] < 1e-5, worst


def _pipeline_on(rank, world_size, dev):
    """1F1B over `world_size` stages on CUDA against one process: the largest difference in
    the stage's gradients (float64: no TF32 question)."""
    from dist_sgd.parallel.pipeline import PipelineStage, Schedule1F1B, split_stages
    dev = _here(dev)
    torch.manual_seed(0)
    whole = nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 7), nn.Tanh(),
                          nn.Linear(7, 3)).double().to(dev)
    g = torch.Generator().manual_seed(1)
    x, y = (torch.randn(8, n, generator=g, dtype=torch.float64).to(dev) for n in (6, 3))
    F.mse_loss(whole(x), y).backward()
    mine = split_stages(whole, world_size)[rank]
    expected = [p.grad.clone() for p in mine.parameters()]
    mine.zero_grad()
    sched = Schedule1F1B(PipelineStage(mine, rank, world_size, dev), 4, F.mse_loss)
    sched.step(*((x,) if rank == 0 else ()), **({"target": y} if rank == world_size - 1 else {}))
    assert all(p.grad.device == dev for p in mine.parameters())
    return max((p.grad - e).abs().max().item() for p, e in zip(mine.parameters(), expected))


def test_pipeline_on_cuda_gloo_world_size_2():
    assert max(launch(_pipeline_on, 2, "cuda:0", backend="gloo")) < 1e-12


def _tensor_parallel_on(rank, world_size, dev):
    """Column- then row-parallel layers made from CUDA nn.Linear's against the two whole."""
    from dist_sgd.parallel.tensor import ColumnParallelLinear, RowParallelLinear
    dev = _here(dev)
    torch.manual_seed(0)
    a, b = nn.Linear(6, 8).double().to(dev), nn.Linear(8, 5).double().to(dev)
    col = ColumnParallelLinear.from_linear(a, gather_output=False)
    row = RowParallelLinear.from_linear(b, input_is_parallel=True)
    assert col.weight.device == dev and row.weight.device == dev, "a layer left the GPU"
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(2), dtype=torch.float64).to(dev)
    return (row(torch.tanh(col(x))) - b(torch.tanh(a(x)))).abs().max().item()


def test_tensor_parallel_on_cuda_gloo_world_size_2():
    assert max(launch(_tensor_parallel_on, 2, "cuda:0", backend="gloo")) < 1e-12


def _ps_on(rank, world_size, dev):
    """A sync parameter server and one worker whose model is on CUDA: the worker's weights
    after 3 pushes against plain SGD on the same gradients."""
    from dist_sgd.beyond.ps import ParameterServer, Worker, roles
    dev = _here(dev)
    servers, workers = roles(world_size, 1)
    torch.manual_seed(0)
    model = nn.Linear(5, 3).to(dev)
    ref = nn.Linear(5, 3).to(dev)
    ref.load_state_dict(model.state_dict())
    if rank in servers:
        ParameterServer(model, servers, workers, lr=0.1, mode="sync", max_updates=3).serve()
        return 0.0
    worker, g = Worker(model, servers), torch.Generator().manual_seed(3)
    while worker.pull():
        x = torch.randn(4, 5, generator=g).to(dev)
        for m in (model, ref):
            m.zero_grad()
            m(x).square().mean().backward()
        with torch.no_grad():
            for p in ref.parameters():
                p -= 0.1 * p.grad
        worker.push()
    worker.finish()
    return max((p - q).abs().max().item() for p, q in zip(model.parameters(), ref.parameters()))


def test_parameter_server_with_a_cuda_worker_gloo_world_size_2():
    assert max(launch(_ps_on, 2, "cuda:0", backend="gloo")) < 1e-6


def _checkpoint_across_devices(rank, world_size, dev, folder):
    """Saved from a CUDA model and optimizer, loaded into a CPU model and into a CUDA one."""
    from dist_sgd.faults.checkpoint import load_checkpoint, save_checkpoint
    dev = _here(dev)
    torch.manual_seed(0)
    model = nn.Linear(5, 3).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(2, 5, device=dev)).sum().backward()
    opt.step()
    save_checkpoint(folder, 1, model, opt)
    worst = 0.0
    for there in ("cpu", dev):
        other = nn.Linear(5, 3).to(there)
        other_opt = torch.optim.SGD(other.parameters(), lr=0.1, momentum=0.9)
        assert load_checkpoint(folder, other, other_opt)["step"] == 1
        assert all(p.device == torch.device(there) for p in other.parameters())
        buf = other_opt.state[next(iter(other.parameters()))]["momentum_buffer"]
        assert buf.device == torch.device(there), f"momentum on {buf.device}"
        worst = max([worst] + [(p.cpu() - q.cpu()).abs().max().item()
                               for p, q in zip(other.parameters(), model.parameters())])
    return worst


def test_a_checkpoint_saved_on_a_gpu_loads_on_the_cpu_and_back_gloo_world_size_2():
    with tempfile.TemporaryDirectory() as folder:
        assert launch(_checkpoint_across_devices, 2, "cuda:0", folder, backend="gloo") == [0.0] * 2


# ---- every lesson at --quick under torchrun, one process on the GPU (NCCL) --------------------

LESSONS = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "lessons",
                                                                     "[0-9][0-9]_*.py")))
# What a lesson needs besides --quick under torchrun: 14 and 17 are one resumable training run
# there (their own story starts torchrun itself), given a checkpoint folder.
EXTRA = {"14": ["--checkpoint-dir"], "17": ["--checkpoint-dir"]}
# A lesson that cannot run as one process says so in one line, naming why: this text.
REFUSES_ONE_RANK = {"15": "needs at least one worker", "10": "a ping-pong needs 2 ranks",
                    "11": "across nodes takes 2 nodes or more"}


def _run_lesson(name):
    with tempfile.TemporaryDirectory() as tmp:
        extra = [a for flag in EXTRA.get(name[:2], []) for a in (flag, os.path.join(tmp, "c"))]
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
               "1", os.path.join(ROOT, "lessons", name), "--quick", *extra]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]), MPLBACKEND="Agg")
        try:
            done = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True,
                                  timeout=300)
            return done.returncode, done.stdout + done.stderr
        except subprocess.TimeoutExpired as e:
            return "timeout", f"{e.stdout or ''}{e.stderr or ''}"


@pytest.fixture(scope="module")
def lesson_runs():
    """Every lesson started at once, six at a time (one GPU holds six NCCL groups of one; the
    machine's cores run their CPU parts): {name: future of (exit code, output)}."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=min(6, os.cpu_count() or 1))
    yield {name: pool.submit(_run_lesson, name) for name in LESSONS}
    pool.shutdown(wait=True)


@pytest.mark.parametrize("name", LESSONS)
def test_lesson_runs_on_one_gpu_under_torchrun(name, lesson_runs):
    code, output = lesson_runs[name].result()
    refusal = REFUSES_ONE_RANK.get(name[:2])
    if refusal and refusal in output:
        return  # it said why, in one line
    assert code == 0, f"{name}: exit {code}\n{output[-4000:]}"
    assert "check failed" not in output, output[-4000:]
