"""An independent PowerSGD hook for one bucket: everything in the hook itself, each
all-reduce waited for at once (no callbacks; simple, no overlap), the residual kept per
bucket, warm start from last step's Q, the random Q seeded from state.rng as torch does."""
import torch
import torch.distributed as dist


def _orthonormal(m, eps):
    for i in range(m.shape[1]):
        col = m[:, i:i + 1]
        col /= col.norm() + eps
        if i + 1 < m.shape[1]:
            m[:, i + 1:] -= (col * m[:, i + 1:]).sum(0, keepdim=True) * col
    return m


def _power_sgd(state, bucket):
    group = state.process_group or dist.group.WORLD
    p = dist.get_world_size(group)
    buf = bucket.buffer()
    done = torch.futures.Future()
    if state.iter < state.start_powerSGD_iter:
        buf.div_(p)
        dist.all_reduce(buf, group=group)
        state.maybe_increase_iter(bucket)
        done.set_result(buf)
        return done
    i = bucket.index()
    if state.use_error_feedback:
        buf.add_(state.error_dict.get(i, torch.zeros_like(buf)))
        before = buf.clone()
    mats, plain = [], []
    for g in bucket.gradients():
        m = g.view(g.shape[0] if g.dim() else 1, -1)
        r = min(*m.shape, state.matrix_approximation_rank)
        worth = (m.shape[0] + m.shape[1]) * r * state.min_compression_rate < m.numel()
        (mats if worth else plain).append(m if worth else g)
    groups = {}
    for m in mats:  # torch orders the matrices by shape, first seen first
        groups.setdefault(tuple(m.shape), []).append(m)
    mats = [m for same in groups.values() for m in same]
    rank = [min(*m.shape, state.matrix_approximation_rank) for m in mats]
    if not state.warm_start or i not in state.q_memory_dict:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(state.rng.randint(1_000_000_000))
            qs = [torch.randn(m.shape[1], r, dtype=buf.dtype) for m, r in zip(mats, rank)]
        state.q_memory_dict[i] = qs
    qs = state.q_memory_dict[i]
    for q in qs:
        _orthonormal(q, state.orthogonalization_epsilon)
    ps = [m @ q for m, q in zip(mats, qs)]
    flat_plain = torch.cat([g.reshape(-1) for g in plain]) if plain else buf.new_empty(0)
    flat_p = torch.cat([x.reshape(-1) for x in ps]) if ps else buf.new_empty(0)
    dist.all_reduce(flat_plain, group=group)
    dist.all_reduce(flat_p, group=group)
    at = 0
    for k, x in enumerate(ps):
        ps[k] = _orthonormal(flat_p[at:at + x.numel()].view_as(x), state.orthogonalization_epsilon)
        at += x.numel()
    new_qs = [m.t() @ x for m, x in zip(mats, ps)]
    flat_q = torch.cat([q.reshape(-1) for q in new_qs]) if new_qs else buf.new_empty(0)
    dist.all_reduce(flat_q, group=group)
    flat_q /= p
    at = 0
    for k, q in enumerate(new_qs):
        qs[k].copy_(flat_q[at:at + q.numel()].view_as(q))
        at += q.numel()
    at = 0
    for g in plain:
        g.copy_(flat_plain[at:at + g.numel()].view_as(g) / p)
        at += g.numel()
    for m, x, q in zip(mats, ps, qs):
        m.copy_(x @ q.t())
    if state.use_error_feedback:
        state.error_dict[i] = before - buf
    state.maybe_increase_iter(bucket)
    done.set_result(buf)
    return done


def powerSGD_hook(state, bucket):
    return _power_sgd(state, bucket)
