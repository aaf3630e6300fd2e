"""Gradient compression as DDP communication hooks: send fewer bytes per step.

A communication hook replaces DDP's "average this bucket" with any function
`hook(state, bucket) -> Future` whose value is the bucket's averaged flat gradient:

    ddp_model.register_comm_hook(state, hook)       # torch's DDP, or ours (dist_sgd.ddp.ddp)

`bucket` has torch's GradBucket methods (ours: dist_sgd.ddp.grad_bucket.GradBucket, which also
runs these hooks on plain tensors, outside DDP).

Three hooks, each written out and equal to torch's (torch.distributed.algorithms.
ddp_comm_hooks; tests/test_compress.py compares them on torch's DDP):

    allreduce_hook(group, bucket)        what DDP does anyway: divide, all-reduce (4 B per value)
    fp16_compress_hook(group, bucket)    the same in float16: half the bytes, ~3 decimal digits
    powerSGD_hook(PowerSGDState, bucket) each gradient matrix M (n x m) sent as two thin
                                         matrices P (n x r) and Q (m x r): (n + m) r values
                                         instead of n m (Vogels et al., NeurIPS 2019)
"""
from collections import defaultdict

import numpy as np
import torch
import torch.distributed as dist

from dist_sgd.comm.flat import copy_back, views
from dist_sgd.comm.ordered import in_order
from dist_sgd.plumbing.mine import swap_in


def _group(process_group):
    """The process group a hook's state names, or the default group (state None)."""
    return process_group if process_group is not None else dist.group.WORLD


def allreduce_hook(process_group, bucket):
    """Average the bucket: what DDP does without a hook (and the hook everybody starts from)."""
    group = _group(process_group)
    tensor = bucket.buffer()
    tensor.div_(group.size())  # divide before adding: in low precision a sum can overflow
    fut = dist.all_reduce(tensor, group=group, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])  # all_reduce's future holds a list of tensors


def fp16_compress_hook(process_group, bucket):
    """Average the bucket in float16: half the bytes on the wire, then back to its dtype."""
    group = _group(process_group)
    buffer = bucket.buffer()
    # ---- exercise fp16_compress_hook: all-reduce a float16 copy / p, then back into the bucket
    half = buffer.to(torch.float16).div_(group.size())  # divide first: float16 overflows at 65504
    fut = dist.all_reduce(half, group=group, async_op=True).get_future()

    def decompress(f):
        buffer.copy_(f.value()[0])  # in place: no second full-size buffer
        return buffer

    return fut.then(decompress)
    # ---- end of exercise


class PowerSGDState:
    """PowerSGD's settings and memory, one object for all buckets (torch's names and defaults).

    matrix_approximation_rank  r: each matrix is sent as (n + m) r numbers
    start_powerSGD_iter        plain all-reduce for this many steps first: early training is
                               fragile, and torch's DDP rebuilds its buckets after step 1
    min_compression_rate       compress a matrix only if n m > rate * (n + m) r
    use_error_feedback         add what compression dropped last step to this step's gradient
    warm_start                 start the power iteration from last step's Q
    orthogonalization_epsilon  added to each column norm: avoids 0 / 0 for an all-zero column
    random_seed                seeds the Q drawn when there is no previous one (same on all ranks)
    """

    def __init__(self, process_group, matrix_approximation_rank=1, start_powerSGD_iter=1_000,
                 min_compression_rate=2, use_error_feedback=True, warm_start=True,
                 orthogonalization_epsilon=0, random_seed=0):
        if (use_error_feedback or warm_start) and start_powerSGD_iter <= 1:
            raise ValueError("start_powerSGD_iter must be > 1 with error feedback or warm start: "
                             "DDP may rebuild its buckets after step 1, and memory kept per "
                             "bucket would no longer fit")
        r = matrix_approximation_rank
        if isinstance(r, bool) or not isinstance(r, int) or r < 1:
            raise ValueError(f"matrix_approximation_rank must be an integer >= 1, "
                             f"got {matrix_approximation_rank!r}")
        self.process_group = process_group
        self.matrix_approximation_rank = matrix_approximation_rank
        self.start_powerSGD_iter = start_powerSGD_iter
        self.min_compression_rate = min_compression_rate
        self.use_error_feedback = use_error_feedback
        self.warm_start = warm_start
        self.orthogonalization_epsilon = orthogonalization_epsilon
        # One seed per fresh Q, drawn from this generator in the same order on every rank: the
        # same projection everywhere (P = M Q must be summable), a new one each time.
        self.rng = np.random.RandomState(random_seed)
        self.error_dict = {}     # bucket index -> what compression dropped (this rank's own)
        self.before_dict = {}    # bucket index -> the gradient before compression (scratch)
        self.p_memory_dict = {}  # bucket index -> every P of the bucket, one flat tensor
        self.q_memory_dict = {}  # bucket index -> every Q of the bucket, one flat tensor
        self.iter = 0            # training steps seen (counted at each step's last bucket)
        self.total_numel_before_compression = 0
        self.total_numel_after_compression = 0

    def maybe_increase_iter(self, bucket):
        if bucket.is_last():  # one step = every bucket once; count it once
            self.iter += 1

    def compression_stats(self):
        """(rate, values before, values after) over every compressed step so far."""
        before, after = self.total_numel_before_compression, self.total_numel_after_compression
        return (before / after if after else 0, before, after)


def should_compress(n, m, rank, min_compression_rate):
    """Is an n x m matrix worth sending as P, Q? Returns (yes, values plain, values as P, Q)."""
    plain, compressed = n * m, (n + m) * rank
    return compressed * min_compression_rate < plain, plain, compressed


def orthogonalize(matrix, epsilon=0):
    """Make the columns of `matrix` (n x r) orthonormal, in place.

    Gram-Schmidt: normalize column i, then remove its direction from every later column. torch
    takes the same route for r <= 2 (and half precision) and QR beyond; both span the same
    columns, and P Q^T does not change when a column of P and of Q flip sign together.
    """
    if matrix.shape[1] > 2 and matrix.dtype not in (torch.float16, torch.bfloat16):
        torch.linalg.qr(matrix, out=(matrix, matrix.new_empty(matrix.shape[1], matrix.shape[1])))
        return matrix
    for i in range(matrix.shape[1]):
        col = matrix[:, i:i + 1]
        # An all-zero column gives 0/0 = NaN unless epsilon > 0 (as in torch).
        col /= torch.linalg.vector_norm(col, dim=0, keepdim=True) + epsilon
        rest = matrix[:, i + 1:]
        if rest.numel():
            rest -= torch.sum(col * rest, dim=0, keepdim=True) * col
    return matrix


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

    PowerSGD is one step of power iteration per training step: P = M Q, orthogonalize P,
    Q = M^T P, and M ~ P Q^T. Since P and Q are all-reduced (linear, so the average of M_i Q is
    (average M_i) Q), every rank ends with the same rank-r approximation of the averaged gradient.
    What the approximation drops is kept per rank (error feedback) and added to the next step's
    gradient, so nothing is lost for good, only delayed. Warm start reuses last step's Q as the
    starting point, so the power iteration keeps improving over steps.
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


# ---- PowerSGD's steps, in the order _power_sgd takes them ----------------------------------

def add_error_feedback(state, index, buffer):
    """Error feedback, before compressing: add into `buffer` (bucket `index`'s flat gradient)
    what compression dropped from it last step, state.error_dict[index] (zeros the first time,
    created here). Returns the gradient as it is now, before compression (a buffer kept per
    bucket in state.before_dict), for keep_residual at the end; None without error feedback."""
    if not state.use_error_feedback:
        return None
    # ---- exercise powerSGD_hook: error feedback: add last step's residual, keep the gradient
    if index in state.error_dict:
        buffer.add_(state.error_dict[index])  # what we failed to send last step
    else:
        state.error_dict[index] = torch.zeros_like(buffer)
    # A buffer kept per bucket: a fresh 4.6 MiB each step costs page faults, a copy less.
    return state.before_dict.setdefault(index, torch.empty_like(buffer)).copy_(buffer)
    # ---- end of exercise


def split_matrices(state, bucket):
    """(matrices worth compressing, gradients sent as they are) of the bucket, every gradient
    seen as a matrix (rows = its first dim); counts the values before and after compression."""
    # 1-D gradients (biases) never pay: (n + 1) r * 2 > n. They go as they are.
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
    return [mat for same in by_shape.values() for mat in same], vectors


def start_q(state, index, matrices, buffer):
    """Every P and Q of the bucket, as one flat tensor each (one all-reduce each) and their
    views (n x r and m x r per matrix): (p_flat, q_flat, ps, qs). Each Q orthogonalized, ready
    for P = M Q: last step's (warm start) or a random one, the same on every rank."""
    ranks = [min(*mat.shape, state.matrix_approximation_rank) for mat in matrices]
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
                q.copy_(torch.randn(*q.shape, dtype=buffer.dtype))  # on the CPU: as torch's
    for q in qs:  # a warm start: last step's Q, averaged: a better start than a random one
        orthogonalize(q, state.orthogonalization_epsilon)
    return p_flat, q_flat, ps, qs


def compute_p(matrices, qs, ps):
    """P = M Q for every matrix M (n x m) and its Q (m x r), into its P (n x r), in place."""
    # Computed as (Q^T M^T)^T: the same sums; a CPU then walks M and Q along their rows (~5x
    # faster than M Q for fc1 here). torch's hook multiplies as written: the last bits can
    # differ (tests: equal within float32 rounding).
    # ---- exercise powerSGD_hook: P = M Q for every matrix M and its Q
    for mat, q, p in zip(matrices, qs, ps):
        p.copy_(torch.matmul(q.t(), mat.t()).t())
    # ---- end of exercise


def compute_q(matrices, ps, qs, epsilon):
    """Once the P's are summed over the ranks: orthogonalize each P (orthogonalize(p,
    epsilon)), then Q = M^T P into its Q, in place (one P on every rank: the Q's are summable)."""
    # ---- exercise powerSGD_hook: orthogonalize each summed P, then Q = M^T P
    for mat, p, q in zip(matrices, ps, qs):
        orthogonalize(p, epsilon)
        # Computed as (P^T M)^T: the same sums, M read row by row instead of down its columns
        # (~20x faster for fc1 here).
        q.copy_(torch.matmul(p.t(), mat).t())
    # ---- end of exercise


def decompress(matrices, ps, qs, q_flat, world_size):
    """Once the Q's are summed (q_flat, the flat tensor qs are views of): average them, then
    write M ~ P Q^T into each matrix, which is a view of the bucket."""
    # ---- exercise powerSGD_hook: average the summed Q's, then M = P Q^T into the bucket
    q_flat.div_(world_size)  # Q was summed over ranks: average it
    for mat, p, q in zip(matrices, ps, qs):
        torch.matmul(p, q.t(), out=mat)  # M ~ P Q^T, straight into the bucket
    # ---- end of exercise
    if torch.cuda.is_available() and q_flat.is_cuda:
        torch.cuda.synchronize(q_flat.device)  # P Q^T must be done before it is read back


def keep_residual(state, index, before, buffer):
    """Error feedback, after decompressing: keep in state.error_dict[index] what compression
    dropped, this rank's gradient (before) minus what the ranks agreed on (buffer)."""
    # ---- exercise powerSGD_hook: keep the residual for the next step
    # For the plain vectors that is (local - average), which sums to zero over ranks and so
    # cancels next step: torch keeps it too, and so do we, to stay equal to torch step for step.
    torch.sub(before, buffer, out=state.error_dict[index])
    # ---- end of exercise


def _completing(result, step, last=True):
    """A future's callback that runs step() and, if last, completes `result` with its value;
    an error anywhere (the collective's or step's) goes to `result`, never lost on a thread."""
    def callback(future):
        try:
            future.value()  # raises the collective's error, if any
            value = step()
            if last:
                result.set_result(value)
        except BaseException as error:  # noqa: BLE001 - the DDP's wait() raises it
            result.set_exception(error)
    return callback


def counted(hook, counter, bytes_per_value=4):
    """`hook`, counting into `counter` ({"bytes": 0, "steps": 0}) the steps and, for a hook
    without state (allreduce, fp16), the bytes it hands to all-reduce. PowerSGD counts its own
    (state.compression_stats()); values_sent says the same on paper."""
    def hook_counting(state, bucket):
        if state is None:
            counter["bytes"] += bucket.buffer().numel() * bytes_per_value
        counter["steps"] += bucket.is_last()
        return hook(state, bucket)
    return hook_counting


def values_sent(shapes, scheme, rank=1, min_compression_rate=2):
    """What each rank hands to all-reduce per step for gradients of these shapes.

    Returns a list of (values, bytes per value), one entry per all-reduce: one for "none"
    (float32) and "fp16"; three for "powerSGD" (the uncompressed tensors, then all P's, then
    all Q's), as powerSGD_hook sends them for one bucket.
    """
    total = sum(int(np.prod(s)) for s in shapes)
    if scheme in ("none", "fp16"):
        return [(total, 4 if scheme == "none" else 2)]
    if scheme != "powerSGD":
        raise ValueError(f"scheme must be 'none', 'fp16' or 'powerSGD', got {scheme!r}")
    plain = p_values = q_values = 0
    for s in shapes:
        n = s[0] if len(s) else 1
        m = int(np.prod(s)) // n if n else 0
        r = min(n, m, rank)
        if should_compress(n, m, r, min_compression_rate)[0]:
            p_values, q_values = p_values + n * r, q_values + m * r
        else:
            plain += n * m
    return [(plain, 4), (p_values, 4), (q_values, 4)]


# DIST_SGD_MINE: a learner's version replaces this one
swap_in(globals(), "fp16_compress_hook", ("fp16_compress_hook",), lesson="12")
# DIST_SGD_MINE: a learner's version replaces this one
swap_in(globals(), "powerSGD_hook", ("powerSGD_hook", "_power_sgd", "add_error_feedback",
                                     "compute_p", "compute_q", "decompress", "keep_residual"),
        lesson="12")
