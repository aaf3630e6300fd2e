"""Q summed over the ranks but not divided by the world size: the gradient p times too big
(P is orthogonalized, so its sum does no harm; Q's does)."""
from collections import defaultdict
import torch
import torch.distributed as dist
from dist_sgd.comm.flat import copy_back, views
from dist_sgd.comm.ordered import in_order
from dist_sgd.ddp.compress import _completing, _group, allreduce_hook, orthogonalize, should_compress


def powerSGD_hook(state, bucket):
    """PowerSGD on one bucket: 1-D gradients averaged as they are, matrices as rank-r P Q^T.

    Three all-reduces per bucket: the plain vectors and the P's at once, the Q's once the P's
    are summed (Q = M^T P needs their sum), from a callback. With several buckets that callback
    would race with the next bucket's all-reduces, issued meanwhile by backward: ranks would
    pair different collectives (gloo aborts). So each bucket runs in hooks.in_order: the next
    bucket starts once this one's Q's are summed; no callback ever blocks a gloo thread. (torch's
    powerSGD_hook waits inside its callbacks: on gloo, with several buckets, it can hang or
    abort. On our DDP, which runs every hook in_order, it runs; on torch's, wrap it:
    `lambda s, b: in_order(lambda: torch_powerSGD_hook(s, b))`.)
    """
    return in_order(lambda: _power_sgd(state, bucket))


def _power_sgd(state, bucket):
    group = _group(state.process_group)
    world_size = group.size()
    buffer = bucket.buffer()  # the bucket's gradients, flat; bucket.gradients() are views of it
    if state.iter < state.start_powerSGD_iter:
        state.maybe_increase_iter(bucket)
        return allreduce_hook(group, bucket)

    index = bucket.index()
    before = None
    if state.use_error_feedback:
        if index in state.error_dict:
            buffer.add_(state.error_dict[index])  # what we failed to send last step
        else:
            state.error_dict[index] = torch.zeros_like(buffer)
        # The gradient before compression, to measure at the end what compression dropped: in
        # a buffer kept per bucket (a fresh 4.6 MiB each step costs page faults, a copy less).
        before = state.before_dict.setdefault(index, torch.empty_like(buffer)).copy_(buffer)

    # Which gradients to compress: every one is seen as a matrix (rows = first dim). 1-D ones
    # (biases) never pay: (n + 1) r * 2 > n. They go as they are, in one all-reduce.
    matrices, vectors = [], []
    for grad in bucket.gradients():
        matrix = grad.view(grad.shape[0] if grad.dim() else 1, -1)
        n, m = matrix.shape
        r = min(n, m, state.matrix_approximation_rank)
        worth, plain, compressed = should_compress(n, m, r, state.min_compression_rate)
        state.total_numel_before_compression += plain
        state.total_numel_after_compression += compressed if worth else plain
        (matrices if worth else vectors).append(matrix if worth else grad)
    # torch lays P and Q out grouped by shape (first-seen order): the random Q values depend
    # on that order, so we keep it.
    by_shape = defaultdict(list)
    for matrix in matrices:
        by_shape[matrix.shape].append(matrix)
    matrices = [mat for same in by_shape.values() for mat in same]
    ranks = [min(*mat.shape, state.matrix_approximation_rank) for mat in matrices]

    # All P's in one flat tensor, all Q's in another: one all-reduce each, not one per matrix.
    fresh_q = not state.warm_start or index not in state.p_memory_dict
    if fresh_q:
        state.p_memory_dict[index] = buffer.new_empty(sum(m.shape[0] * r
                                                          for m, r in zip(matrices, ranks)))
        state.q_memory_dict[index] = buffer.new_empty(sum(m.shape[1] * r
                                                          for m, r in zip(matrices, ranks)))
    p_flat, q_flat = state.p_memory_dict[index], state.q_memory_dict[index]
    ps = views(p_flat, [(m.shape[0], r) for m, r in zip(matrices, ranks)])
    qs = views(q_flat, [(m.shape[1], r) for m, r in zip(matrices, ranks)])

    if fresh_q:
        # A random start, the same on every rank: seed from the shared generator, on the CPU,
        # without disturbing the training's own random stream (dropout, shuffling).
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(state.rng.randint(1_000_000_000))
            for q in qs:
                q.copy_(torch.randn(*q.shape, dtype=buffer.dtype))
                orthogonalize(q, state.orthogonalization_epsilon)
    else:
        for q in qs:  # last step's Q, averaged: a better start than a random one
            orthogonalize(q, state.orthogonalization_epsilon)

    # P = M Q: this rank's M projected on Q, computed as (Q^T M^T)^T. The same sums; a CPU
    # then walks M and Q along their rows (~5x faster than M Q for fc1 here). torch's hook
    # multiplies as written: the last bits can differ (tests: equal within float32 rounding).
    for mat, q, p in zip(matrices, qs, ps):
        p.copy_(torch.matmul(q.t(), mat.t()).t())

    flat_vectors = torch.cat([v.view(-1) for v in vectors]) if vectors else buffer.new_empty(0)
    vectors_summed = dist.all_reduce(flat_vectors, group=group, async_op=True).get_future()
    # Sum (not average) of the P's: P is orthogonalized next, which undoes any scale.
    ps_summed = dist.all_reduce(p_flat, group=group, async_op=True).get_future()
    result = torch.futures.Future()

    def ps_done_send_qs():
        for mat, p, q in zip(matrices, ps, qs):
            orthogonalize(p, state.orthogonalization_epsilon)
            # Q = M^T P (one P everywhere: summable), computed as (P^T M)^T: the same sums,
            # M read row by row instead of down its columns (~20x faster for fc1 here).
            q.copy_(torch.matmul(p.t(), mat).t())
        qs_summed = dist.all_reduce(q_flat, group=group, async_op=True).get_future()
        torch.futures.collect_all([vectors_summed, qs_summed]).add_done_callback(
            _completing(result, decompress))

    def decompress():
        copy_back(flat_vectors.div_(world_size), vectors)
        for mat, p, q in zip(matrices, ps, qs):
            torch.matmul(p, q.t(), out=mat)  # M ~ P Q^T, straight into the bucket
        if torch.cuda.is_available():
            torch.cuda.synchronize(buffer.device)  # P Q^T must be done before we read it back
        if state.use_error_feedback:
            # This rank's gradient minus what the ranks agreed on. For the plain vectors that is
            # (local - average), which sums to zero over ranks and so cancels next step: torch
            # keeps it too, and so do we, to stay equal to torch step for step.
            torch.sub(before, buffer, out=state.error_dict[index])
        if not state.warm_start:
            state.p_memory_dict.clear()
            state.q_memory_dict.clear()
        state.maybe_increase_iter(bucket)
        return buffer

    ps_summed.add_done_callback(_completing(result, ps_done_send_qs, last=False))
    return result


CAUGHT_BY = "rank 2 with error feedback, no warm start: torch's gradients, 5 steps"
