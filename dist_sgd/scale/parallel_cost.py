"""What splitting the model instead of the data costs, on paper (lessons 19-20).

    parallel_bytes(strategy, params, layers, activation, world_size)   bytes a rank sends a step
    parallel_state_bytes(strategy, params, world_size)                 bytes of state it holds

for strategy "data" (a ring all-reduce of the gradients), "tensor" (Megatron's all-reduces of
activations inside every block) or "pipeline" (a stage's activations and their gradients).
dist_sgd/bench/modelpar.py measures all three on emulated nodes beside these numbers.
"""
import numpy as np

STRATEGIES = ("data", "tensor", "pipeline")


def _check(world_size):
    if isinstance(world_size, bool) or not isinstance(world_size, (int, np.integer)) \
            or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")


def parallel_bytes(strategy, params, layers, activation, world_size, elem=4, allreduces=4):
    """Bytes one rank sends per training step, for a model of `layers` blocks holding `params`
    parameters in all, whose activations between two blocks have `activation` elements for
    the whole batch (batch x sequence x width), each `elem` bytes, split `world_size` ways:

        data       a ring all-reduce of the gradients:           2(p-1)/p x params
        tensor     `allreduces` per block (attention + MLP: 2 forward, 2 backward; an MLP
                   alone: 1 and 1):                      allreduces x layers x 2(p-1)/p x act
        pipeline   a stage's output forward, its input's gradient back (stages in between;
                   the first and last send one of the two):      2 x act (at most)

    Data parallelism's bytes grow with the model, tensor parallelism's with the batch and
    the depth (and it talks inside every layer: it needs the fastest link), the pipeline's
    only with the batch: the fewest bytes, paid for with the bubble.
    """
    _check(world_size)
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    p = world_size
    if p == 1:
        return 0.0
    ring = 2 * (p - 1) / p
    return elem * {"data": ring * params, "tensor": allreduces * layers * ring * activation,
                   "pipeline": 2 * activation}[strategy]


def parallel_state_bytes(strategy, params, world_size, per_param=16):
    """Bytes of model state (parameters, gradients, optimizer state: per_param bytes each,
    16 for float32 Adam) one rank holds: data parallelism keeps all of it everywhere, tensor
    and pipeline parallelism 1/p each (the activations are the lesson's measurements)."""
    _check(world_size)
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    return per_param * params / (1 if strategy == "data" else world_size)
