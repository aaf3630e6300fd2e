"""How a lesson checks what it built against torch's own: the largest absolute difference.

Every lesson ends its checks with lines made by `check(...)`:

    all_reduce (ring) vs torch: max difference 0.00e+00 (tolerance 1e-06)

`check` prints nothing itself (rank 0 prints, see `launch.log`); it raises when the difference
is over the tolerance, so a wrong result fails the lesson's exit code, and tests/test_lessons.py
reads these lines back to hold each lesson to the bounds it states.
"""
import torch


def _tensors(x):
    if isinstance(x, torch.nn.Module):
        return [p.detach() for p in x.parameters()]
    if isinstance(x, torch.Tensor):
        return [x.detach()]
    return [t.detach() if isinstance(t, torch.Tensor) else torch.as_tensor(t) for t in x]


def max_diff(a, b):
    """Largest |a - b| between two tensors, two lists of tensors, or two modules' parameters."""
    xs, ys = _tensors(a), _tensors(b)
    if len(xs) != len(ys):
        raise ValueError(f"max_diff: {len(xs)} tensors against {len(ys)}")
    worst = 0.0
    for x, y in zip(xs, ys):
        if x.shape != y.shape:
            raise ValueError(f"max_diff: shapes differ, {tuple(x.shape)} vs {tuple(y.shape)}")
        if x.numel():
            worst = max(worst, (x.double() - y.to(x.device).double()).abs().max().item())
    return worst


def check(what, diff, tolerance):
    """The line a lesson prints for one check; raises AssertionError when diff > tolerance."""
    line = f"{what}: max difference {diff:.2e} (tolerance {tolerance:.0e})"
    if not diff <= tolerance:  # also catches NaN
        raise AssertionError(f"check failed: {line}")
    return line


def exact_float32(deterministic=False):
    """Float32 on a GPU as a comparison tuned on a CPU expects it; nothing changes on a CPU.

    TF32 off: on Ampere and later GPUs cuDNN's convolutions (and, if allowed, matmuls) round
    their inputs to 10-bit mantissas by default, which moved lesson 09's gradients by 2.44e-04
    on an H200 against a tolerance of 1e-05 (lesson 09 teaches it). deterministic=True: torch's
    deterministic algorithms too (warn_only: an op without one warns), since a 'bit for bit'
    check on a GPU holds only with them (atomics sum in a different order each run)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if deterministic and torch.cuda.is_available():
        import os
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS's deterministic mode
        torch.backends.cudnn.benchmark = False
        torch.use_deterministic_algorithms(True, warn_only=True)
