"""add_error_feedback returns the bucket's buffer itself as `before`, not a copy: the buffer is
then overwritten with P Q^T, so at the end before - buffer is zero, no residual is ever
kept, and error feedback does nothing. `before` must hold the gradient as it was before
compression: a copy."""
import torch
import torch.distributed as dist
from dist_sgd.comm.flat import copy_back
from dist_sgd.comm.ordered import in_order
from dist_sgd.ddp.compress import (_completing, _group, allreduce_hook, orthogonalize,
                                   split_matrices, start_q)


CAUGHT_BY = "rank 1 with error feedback and warm start: torch's gradients, 5 steps"
HINT = "a later compressed step: the residual of the"


def powerSGD_hook(state, bucket):
    """PowerSGD on one bucket: 1-D gradients averaged as they are, matrices as rank-r P Q^T.

    Three all-reduces per bucket: the plain vectors and the P's at once, the Q's once the P's
    are summed (Q = M^T P needs their sum), from a callback. With several buckets that callback
    would race with the next bucket's all-reduces, issued meanwhile by backward: ranks would
    pair different collectives (gloo aborts). So each bucket runs in_order (dist_sgd.comm.
    ordered): the next bucket starts once this one's Q's are summed; no callback ever blocks a
    gloo thread. (torch's powerSGD_hook waits inside its callbacks: on gloo, with several
    buckets, it can hang or abort. On our DDP, which runs every hook in_order, it runs; on
    torch's, wrap it: `lambda s, b: in_order(lambda: torch_powerSGD_hook(s, b))`.)
    """
    return in_order(lambda: _power_sgd(state, bucket))


def _power_sgd(state, bucket):
    """The steps of one bucket, chained on its three all-reduces (each step is named below)."""
    group = _group(state.process_group)
    world_size = group.size()
    buffer = bucket.buffer()  # the bucket's gradients, flat; bucket.gradients() are views of it
    if state.iter < state.start_powerSGD_iter:
        state.maybe_increase_iter(bucket)
        return allreduce_hook(group, bucket)

    index = bucket.index()
    before = add_error_feedback(state, index, buffer)
    matrices, vectors = split_matrices(state, bucket)
    p_flat, q_flat, ps, qs = start_q(state, index, matrices, buffer)
    compute_p(matrices, qs, ps)

    flat_vectors = torch.cat([v.view(-1) for v in vectors]) if vectors else buffer.new_empty(0)
    vectors_summed = dist.all_reduce(flat_vectors, group=group, async_op=True).get_future()
    # Sum (not average) of the P's: P is orthogonalized next, which undoes any scale.
    ps_summed = dist.all_reduce(p_flat, group=group, async_op=True).get_future()
    result = torch.futures.Future()

    def ps_summed_then_qs():
        compute_q(matrices, ps, qs, state.orthogonalization_epsilon)
        qs_summed = dist.all_reduce(q_flat, group=group, async_op=True).get_future()
        torch.futures.collect_all([vectors_summed, qs_summed]).add_done_callback(
            _completing(result, qs_summed_then_decompress))

    def qs_summed_then_decompress():
        copy_back(flat_vectors.div_(world_size), vectors)
        decompress(matrices, ps, qs, q_flat, world_size)
        if state.use_error_feedback:
            keep_residual(state, index, before, buffer)
        if not state.warm_start:
            state.p_memory_dict.clear()
            state.q_memory_dict.clear()
        state.maybe_increase_iter(bucket)
        return buffer

    ps_summed.add_done_callback(_completing(result, ps_summed_then_qs, last=False))
    return result


def add_error_feedback(state, index, buffer):
    """Error feedback, before compressing: add into `buffer` (bucket `index`'s flat gradient)
    what compression dropped from it last step, state.error_dict[index] (zeros the first time,
    created here). Returns the gradient as it is now, before compression (a buffer kept per
    bucket in state.before_dict), for keep_residual at the end; None without error feedback."""
    if not state.use_error_feedback:
        return None
    if index not in state.error_dict:
        state.error_dict[index] = torch.zeros_like(buffer)
    else:
        buffer.add_(state.error_dict[index])
    return buffer


def compute_p(matrices, qs, ps):
    """P = M Q for every matrix M (n x m) and its Q (m x r), into its P (n x r), in place."""
    # Computed as (Q^T M^T)^T: the same sums; a CPU then walks M and Q along their rows (~5x
    # faster than M Q for fc1 here). torch's hook multiplies as written: the last bits can
    # differ (tests: equal within float32 rounding).
    for m, q, p in zip(matrices, qs, ps):
        p.copy_(m @ q)


def compute_q(matrices, ps, qs, epsilon):
    """Once the P's are summed over the ranks: orthogonalize each P (orthogonalize(p,
    epsilon)), then Q = M^T P into its Q, in place (one P on every rank: the Q's are summable)."""
    for m, p, q in zip(matrices, ps, qs):
        orthogonalize(p, epsilon)
        q.copy_(m.t() @ p)


def decompress(matrices, ps, qs, q_flat, world_size):
    """Once the Q's are summed (q_flat, the flat tensor qs are views of): average them, then
    write M ~ P Q^T into each matrix, which is a view of the bucket."""
    q_flat.div_(world_size)
    for m, p, q in zip(matrices, ps, qs):
        m.copy_(p @ q.t())
    if torch.cuda.is_available() and q_flat.is_cuda:
        torch.cuda.synchronize(q_flat.device)  # P Q^T must be done before it is read back


def keep_residual(state, index, before, buffer):
    """Error feedback, after decompressing: keep in state.error_dict[index] what compression
    dropped, this rank's gradient (before) minus what the ranks agreed on (buffer)."""
    state.error_dict[index] = before - buffer
