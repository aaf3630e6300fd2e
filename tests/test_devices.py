"""What a GPU needs of the code, checked on a CPU (tests/test_gpu.py runs it on a GPU).

- gloo's send/recv read host memory only: our point-to-point paths (comm/wire: post, isend,
  irecv, through_host) stage a tensor off the CPU through a host copy. Here every tensor is
  treated as if it were on a GPU (wire.staged patched to say so inside the ranks), so the
  copies and the copies back run, and every collective must still equal torch's;
- what the library creates lives on the device of its inputs: every tensor factory call in
  the library pieces (torch.zeros, torch.tensor, ...) names its device, or its line says why
  the CPU is meant (`# on the CPU: ...`) - read from the source, no GPU needed.
- tests/test_gpu.py's rank code runs here on CPU tensors, so it cannot rot where CI has no GPU.
Lessons have their own rule (tests/test_lessons.py: device_breaks).
"""
import ast
import glob
import os

import pytest
import torch
import torch.distributed as dist

from dist_sgd.plumbing.launch import launch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _everything_staged(rank, world_size):
    """Our collectives (every all-reduce algorithm, broadcast, all_gather, reduce_scatter,
    reduce) and the textbook's, every tensor staged as a GPU's would be:
    (largest difference from torch's per piece, how many tensors were staged)."""
    from dist_sgd.comm import collectives as ours
    from dist_sgd.comm import textbook, wire
    staged = []
    wire.staged = lambda t: staged.append(t.numel()) or True  # as if every tensor were on a GPU
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(1001, generator=gen)
    out = {}
    for algorithm in ours.ALL_REDUCE_ALGORITHMS:
        a, b = x.clone(), x.clone()
        ours.all_reduce(a, algorithm=algorithm)
        dist.all_reduce(b)
        out[f"all_reduce {algorithm}"] = (a - b).abs().max().item()
    for name, mod in (("ours", ours), ("textbook", textbook)):
        a, b = x.clone(), x.clone()
        mod.broadcast(a, 1 % world_size)
        dist.broadcast(b, 1 % world_size)
        out[f"broadcast {name}"] = (a - b).abs().max().item()
        a = [torch.full_like(x, -1.0) for _ in range(world_size)]
        b = [torch.empty_like(x) for _ in range(world_size)]
        mod.all_gather(a, x)
        dist.all_gather(b, x)
        out[f"all_gather {name}"] = max((p - q).abs().max().item() for p, q in zip(a, b))
        pieces = [x[i::world_size][:100].contiguous() for i in range(world_size)]
        a, b = torch.full_like(pieces[0], -1.0), torch.empty_like(pieces[0])
        mod.reduce_scatter(a, pieces)
        dist.reduce_scatter(b, [p.clone() for p in pieces])
        out[f"reduce_scatter {name}"] = (a - b).abs().max().item()
    a, b = x.clone(), x.clone()
    ours.reduce(a, dst=0)
    dist.reduce(b, dst=0)
    out["reduce"] = (a - b).abs().max().item() if rank == 0 else 0.0
    return out, len(staged)


@pytest.mark.parametrize("world_size", [2, 3])
def test_our_collectives_stage_through_host_memory_and_still_equal_torchs(world_size):
    for diffs, staged in launch(_everything_staged, world_size):
        assert staged > 0, "nothing went through wire.staged: a p2p path bypasses the wire"
        assert max(diffs.values()) < 1e-5, diffs


def _staged_decision(rank, world_size):
    from dist_sgd.comm import wire
    return wire.staged(torch.ones(2)), wire.staged(torch.ones(2, device="meta"))


def test_staging_is_for_tensors_off_the_cpu_over_gloo_only():
    # "meta" stands in for a GPU here: a device that is not the CPU. Over NCCL nothing is staged.
    assert launch(_staged_decision, 1, backend="gloo") == [(False, True)]


# ---- every tensor the library creates names its device ---------------------------------------

FACTORIES = {"zeros", "ones", "empty", "full", "tensor", "arange", "rand", "randn", "randint",
             "linspace", "eye"}
# The library pieces a rank computes with; bench/course/plumbing/scale/sgd.data run around them.
PIECES = ["comm", "ddp", "shard", "faults", "beyond", "parallel", "large_batch", "sgd/sync.py",
          "sgd/train.py", "sgd/optim.py"]
CPU_MEANT = "# on the CPU:"


def factory_breaks(source, path="<source>"):
    """Calls torch.<factory>(...) without device= (and not .to(...) at once) whose lines, or
    the line above, do not say `# on the CPU: why`."""
    lines = source.splitlines()
    placed = set()
    tree = ast.parse(source)
    for node in ast.walk(tree):  # torch.zeros(...).to(x): placed at once
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("to", "cuda") and isinstance(node.func.value, ast.Call):
            placed.add(id(node.func.value))
    breaks = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in FACTORIES and getattr(node.func.value, "id", "") == "torch"):
            continue
        if any(k.arg == "device" for k in node.keywords) or id(node) in placed:
            continue
        said = any(CPU_MEANT in lines[n - 1] for n in range(max(node.lineno - 1, 1),
                                                                 node.end_lineno + 1))
        if not said:
            breaks.append(f"{path}:{node.lineno}: {ast.unparse(node)[:70]} names no device")
    return breaks


def _piece_files():
    for piece in PIECES:
        where = os.path.join(ROOT, "dist_sgd", piece)
        yield from ([where] if where.endswith(".py") else
                    sorted(glob.glob(os.path.join(where, "**", "*.py"), recursive=True)))


def test_every_tensor_the_library_creates_names_its_device():
    breaks = []
    for path in _piece_files():
        with open(path) as f:
            breaks += factory_breaks(f.read(), os.path.relpath(path, ROOT))
    assert not breaks, "\n".join(breaks)


def test_the_factory_rule_catches_a_tensor_left_on_the_cpu():
    assert factory_breaks("x = torch.zeros(3, device=y.device)\nz = torch.ones(2).to(d)\n") == []
    assert factory_breaks("x = torch.zeros(3)  # on the CPU: indices for a sampler\n") == []
    assert factory_breaks("x = torch.zeros(3)\n")  # the mistake: made on the CPU, unsaid
    assert factory_breaks("flag = torch.tensor([1],\n    dtype=torch.int64)\n")


def test_exact_float32_turns_tf32_off_and_changes_nothing_else_on_a_cpu():
    from dist_sgd.plumbing.check import exact_float32
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.are_deterministic_algorithms_enabled())
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        exact_float32(deterministic=True)
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
        if not torch.cuda.is_available():  # on a CPU every kernel is deterministic already
            assert torch.are_deterministic_algorithms_enabled() == saved[2]
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
        torch.use_deterministic_algorithms(saved[2])


def _gpu_tests_on_the_cpu(rank, world_size, folder):
    """tests/test_gpu.py's rank code, on CPU tensors: what it computes holds here too, so a
    GPU session meets only what is the GPU's."""
    import test_gpu as G
    return {"collectives": max(G._collectives_on(rank, world_size, "cpu").values()),
            "ddp": G._ddp_on(rank, world_size, "cpu", 2),
            "hooks": max(G._hooks_on(rank, world_size, "cpu").values()),
            "pipeline": G._pipeline_on(rank, world_size, "cpu"),
            "tensor parallel": G._tensor_parallel_on(rank, world_size, "cpu"),
            "parameter server": G._ps_on(rank, world_size, "cpu"),
            "checkpoint": G._checkpoint_across_devices(rank, world_size, "cpu", folder)}


def test_the_gpu_tests_rank_code_holds_on_cpu_tensors(tmp_path):
    for worst in launch(_gpu_tests_on_the_cpu, 2, str(tmp_path)):
        assert max(worst.values()) < 1e-5, worst


def test_the_gpu_benchmarks_workers_run_on_the_cpu():
    """bench/gpu.py measures on a GPU only; its workers' code, at --quick, runs here."""
    from dist_sgd.bench import gpu
    [rows] = launch(gpu._ddp_worker, 1, True, backend="gloo")
    assert {r["who"] for r in rows} == {"our DDP", "torch DDP"} and len(rows) == 4, rows
    rows = launch(gpu._all_reduce_worker, 2, True, "cpu", backend="gloo")[0]
    assert {r["who"] for r in rows} == {"ours (ring)", "torch"} and len(rows) == 6, rows
