"""Our DDP (the core BucketedDDP and the wrapper DistributedDataParallel), one named test per
property.

A spawn costs seconds, so the ranks of one group per world size run every case of that world
size (dist_sgd.plumbing.cases), and each test reads its own case's outcome. Each case is
written just above the test that reads it: `@CASES.case(world_sizes=..., **grid)` registers
case(rank, world_size, ref, **values) to run inside the ranks, once per combination of the
grid's values (ref: the one-process reference_run of that world size), and
held(world_size, case, **values) fails with every rank's message if an assertion inside the
case failed on some rank.

Two families:
- equal to one process computing the whole batch (Toy, float64, tight tolerances): frozen,
  tied, a buffer, and a layer some ranks use in some steps and no rank in others;
- equal to torch's DDP bit for bit (rtol=0, atol=0) at world sizes 2, 3 and 4, with and
  without torch's own comm hooks (Odd, float32: odd shapes, frozen, tied, sometimes unused):
  equal buckets in equal order make gloo add the same numbers in the same order; torch's
  timing of the rebuild (static_graph), of the buffer broadcast, and its order of buckets of
  several dtypes.
"""
import functools

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook as psgd
from torch.nn.parallel import DistributedDataParallel as TorchDDP
from torch.testing import assert_close

from dist_sgd.comm import collectives
from dist_sgd.comm.ordered import in_order
from dist_sgd.ddp import compress
from dist_sgd.ddp.bucketed import BucketedDDP, assign_buckets
from dist_sgd.ddp.ddp import DistributedDataParallel
from dist_sgd.ddp.steps import HookDDP, NaiveDDP
from dist_sgd.plumbing.cases import Cases

PER_RANK = 4
STEPS = 3
CAPS = {"default": None, "per parameter": 0, "tiny": 0.0002, "one bucket": 1024}
CORE_CAPS = ["default", "tiny"]
AT_PROPERTIES, AT_TORCH = [1, 2, 3], [2, 3, 4]


# ---- one spawned group per world size, shared by the tests -------------------------------------

def one_process(rank, world_size):
    """What every case receives after rank and world size: the one-process reference_run."""
    return (reference_run(world_size),)


CASES = Cases(setup=one_process)
held = CASES.held


def ws(sizes):
    return pytest.mark.parametrize("world_size", sizes, ids=lambda w: f"ws{w}")


class Toy(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(6, 8)
        self.frozen = nn.Linear(8, 8).requires_grad_(False)
        self.mid = nn.Linear(8, 8)
        self.extra = nn.Linear(8, 8)  # used only when use_extra is true
        self.dec = nn.Linear(8, 8)
        self.dec.weight = self.mid.weight  # tied: one Parameter, two layers
        self.head = nn.Linear(8, 3)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 8))

    def forward(self, x, use_extra=True):
        h = torch.tanh(self.frozen(torch.tanh(self.enc(x)))) * self.scale
        h = torch.tanh(self.mid(h))
        if use_extra:
            h = h + torch.tanh(self.extra(h))
        return self.head(torch.tanh(self.dec(h)))


def make_model(seed):
    torch.manual_seed(seed)
    return Toy().double()


def uses_extra(step, rank):
    # step 0: every rank; step 1: rank 0 only; step 2: nobody (the gradient must stay None)
    return (True, rank == 0, False)[step % 3]


def batch(step, world_size, micro=1):
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(world_size * PER_RANK * micro, 6, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (world_size * PER_RANK * micro,), generator=g)
    return x, y


def shard(t, rank, world_size):
    return t.chunk(world_size)[rank]


def optimizer(model):
    # momentum and weight decay: a None gradient (skipped) and a zero one (not) differ
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)


def reference_run(world_size):
    """One process, the whole global batch: per-step gradients and weights."""
    model = make_model(0)
    opt = optimizer(model)
    grads, weights = [], []
    for step in range(STEPS):
        x, y = batch(step, world_size)
        opt.zero_grad()
        loss = sum(F.cross_entropy(model(shard(x, r, world_size), uses_extra(step, r)),
                                   shard(y, r, world_size)) for r in range(world_size))
        (loss / world_size).backward()  # the mean over equal shards = the full-batch mean
        grads.append({n: None if p.grad is None else p.grad.clone()
                      for n, p in model.named_parameters()})
        opt.step()
        weights.append({n: p.detach().clone() for n, p in model.named_parameters()})
    return grads, weights


def train(wrapped, inner, rank, world_size):
    """STEPS steps; per step the gradients right after backward and the weights after step."""
    opt = optimizer(inner)
    grads, weights = [], []
    for step in range(STEPS):
        x, y = batch(step, world_size)
        opt.zero_grad()
        out = wrapped(shard(x, rank, world_size), use_extra=uses_extra(step, rank))
        F.cross_entropy(out, shard(y, rank, world_size)).backward()
        # no explicit synchronization: the gradients must be averaged when backward returns
        grads.append({n: None if p.grad is None else p.grad.clone()
                      for n, p in inner.named_parameters()})
        opt.step()
        weights.append({n: p.detach().clone() for n, p in inner.named_parameters()})
    return grads, weights


def same(got, expected, what, **exact):
    for step, (g, e) in enumerate(zip(got, expected)):
        for name in e:
            if e[name] is None or g[name] is None:
                assert g[name] is None and e[name] is None, \
                    f"{what}: step {step}: {name}: {g[name]} vs {e[name]}"
            else:
                assert_close(g[name], e[name], **exact,
                             msg=lambda m: f"{what}: step {step}: {name}: {m}")


# ---- equal to one process (Toy, float64) --------------------------------------------------------

@CASES.case(world_sizes=AT_PROPERTIES)
def broadcast(rank, world_size, ref):
    model = make_model(seed=rank)  # ranks start from different weights ...
    DistributedDataParallel(model)
    for a, b in zip(model.state_dict().values(), make_model(0).state_dict().values()):
        assert_close(a, b)  # ... and end up with rank 0's


@ws(AT_PROPERTIES)
def test_ranks_start_from_rank_0s_weights(world_size):
    held(world_size, broadcast)


@CASES.case(world_sizes=AT_PROPERTIES, cap=list(CAPS))
def grads_of_wrapper(rank, world_size, ref, cap):
    model = make_model(seed=rank)
    got = train(DistributedDataParallel(model, CAPS[cap]), model, rank, world_size)
    same(got[0], ref[0], f"grads, {cap}")
    same(got[1], ref[1], f"weights, {cap}")


@ws(AT_PROPERTIES)
@pytest.mark.parametrize("cap", list(CAPS))
def test_grads_match_single_process_each_step(world_size, cap):
    held(world_size, grads_of_wrapper, cap=cap)


@CASES.case(world_sizes=AT_PROPERTIES, cap=CORE_CAPS)
def grads_of_core(rank, world_size, ref, cap):
    model = make_model(seed=rank)
    got = train(BucketedDDP(model, CAPS[cap]), model, rank, world_size)
    same(got[0], ref[0], f"grads, {cap}")
    same(got[1], ref[1], f"weights, {cap}")


@ws(AT_PROPERTIES)
@pytest.mark.parametrize("cap", CORE_CAPS)
def test_core_grads_match_single_process_each_step(world_size, cap):
    held(world_size, grads_of_core, cap=cap)


@CASES.case(world_sizes=AT_PROPERTIES, who=["wrapper", "core"])
def unused(rank, world_size, ref, who):
    model = make_model(seed=rank)
    cls = DistributedDataParallel if who == "wrapper" else BucketedDDP
    grads, _ = train(cls(model, bucket_cap_mb=0), model, rank, world_size)
    assert grads[2]["extra.weight"] is None, "a parameter no rank used got a gradient"
    assert grads[1]["extra.weight"] is not None, "a parameter rank 0 used got none"


@ws(AT_PROPERTIES)
@pytest.mark.parametrize("who", ["wrapper", "core"])
def test_param_no_rank_used_keeps_grad_none_in_core_and_wrapper(world_size, who):
    held(world_size, unused, who=who)


@CASES.case(world_sizes=AT_PROPERTIES)
def frozen_and_tied(rank, world_size, ref):
    model = make_model(seed=rank)
    ddp = DistributedDataParallel(model, bucket_cap_mb=0)
    members = [id(p) for b in ddp.buckets for p in b.params]
    assert len(members) == len(set(members)), "a parameter sits in two buckets"
    assert id(model.mid.weight) in members and id(model.frozen.weight) not in members
    assert len(members) == sum(p.requires_grad for p in model.parameters())
    grads, _ = train(ddp, model, rank, world_size)
    assert grads[0]["frozen.weight"] is None, "a frozen parameter got a gradient"
    assert_close(grads[0]["mid.weight"], ref[0][0]["mid.weight"])  # both uses, summed once


@ws(AT_PROPERTIES)
def test_frozen_param_skipped_and_tied_param_reduced_once(world_size):
    held(world_size, frozen_and_tied)


@CASES.case(world_sizes=AT_PROPERTIES)
def each_bucket_once(rank, world_size, ref):
    calls = []

    def counting_all_reduce(t):
        calls.append(t.data_ptr())
        dist.all_reduce(t)

    model = make_model(seed=rank)
    ddp = DistributedDataParallel(model, bucket_cap_mb=CAPS["tiny"], all_reduce=counting_all_reduce)
    x, y = batch(0, world_size)
    for step in range(3):  # step 0: one bucket; then rebuilt into several
        calls.clear()
        used = sorted(b.flat.data_ptr() for b in ddp.buckets)  # the buckets of this backward
        F.cross_entropy(ddp(shard(x, rank, world_size)), shard(y, rank, world_size)).backward()
        assert sorted(calls) == used, f"step {step}: {len(calls)} all-reduces, {len(used)} buckets"
        ddp.finish_gradient_synchronization()  # again: nothing more may be sent
        assert len(calls) == len(used)
    assert len(ddp.buckets) > 2


@ws(AT_PROPERTIES)
def test_each_bucket_reduced_once(world_size):
    held(world_size, each_bucket_once)


@CASES.case(world_sizes=AT_PROPERTIES)
def our_all_reduce(rank, world_size, ref):
    model = make_model(seed=rank)
    ddp = DistributedDataParallel(model, bucket_cap_mb=CAPS["tiny"],
                                  all_reduce=collectives.all_reduce)
    same(train(ddp, model, rank, world_size)[0], ref[0], "ours + our all_reduce")


@ws(AT_PROPERTIES)
def test_our_all_reduce_gives_the_same_grads(world_size):
    held(world_size, our_all_reduce)


@CASES.case(world_sizes=AT_PROPERTIES)
def no_sync(rank, world_size, ref):
    # Two local backward passes, then a synced one == one batch three times larger. The extra
    # layer is used in the first (local) pass only: the synced pass must still send its
    # accumulated gradient, not zeros, and average it (torch counts it as used).
    model = make_model(seed=rank)
    ddp = DistributedDataParallel(model, bucket_cap_mb=CAPS["tiny"])
    ddp.trace = []
    x, y = batch(7, world_size, micro=3)
    xs, ys = shard(x, rank, world_size).chunk(3), shard(y, rank, world_size).chunk(3)
    for i in range(2):
        with ddp.no_sync():
            (F.cross_entropy(ddp(xs[i], use_extra=i == 0), ys[i]) / 3).backward()
    assert not any(e["event"] == "launch" for e in ddp.trace), "no_sync launched an all-reduce"
    (F.cross_entropy(ddp(xs[2], use_extra=False), ys[2]) / 3).backward()
    big = make_model(0)
    for i in range(3):  # micro-batch i of the global batch: every rank's i-th chunk
        xi = torch.cat([shard(x, r, world_size).chunk(3)[i] for r in range(world_size)])
        yi = torch.cat([shard(y, r, world_size).chunk(3)[i] for r in range(world_size)])
        (F.cross_entropy(big(xi, use_extra=i == 0), yi) / 3).backward()
    for (n, p), q in zip(model.named_parameters(), big.parameters()):
        assert_close(p.grad, q.grad, msg=lambda m: f"no_sync: {n}: {m}")


@ws(AT_PROPERTIES)
def test_no_sync_accumulates(world_size):
    held(world_size, no_sync)


@CASES.case(world_sizes=AT_PROPERTIES)
def overlap(rank, world_size, ref):
    model = make_model(seed=rank)
    ddp = DistributedDataParallel(model, bucket_cap_mb=0)
    x, y = batch(0, world_size)
    for step in range(2):  # step 0: one bucket, sent at the end; then rebuilt: overlapped
        ddp.trace = []
        F.cross_entropy(ddp(shard(x, rank, world_size)), shard(y, rank, world_size)).backward()
    events = [e["event"] for e in ddp.trace]
    last_hook = len(events) - 1 - events[::-1].index("hook")
    assert events.index("launch") < last_hook, events
    assert events.count("done") == len(ddp.buckets) and events[-1] == "synchronized", events


@ws(AT_PROPERTIES)
def test_first_all_reduce_starts_before_backward_ends(world_size):
    held(world_size, overlap)


@CASES.case(world_sizes=AT_PROPERTIES)
def steps_1_and_2(rank, world_size, ref):
    # every rank uses every layer (step 0): step 2 cannot handle less
    for cls in (NaiveDDP, HookDDP):
        model = make_model(seed=rank)
        wrapped = cls(model)
        x, y = batch(0, world_size)
        F.cross_entropy(wrapped(shard(x, rank, world_size)), shard(y, rank, world_size)).backward()
        wrapped.finish_gradient_synchronization()
        for n, p in model.named_parameters():
            if ref[0][0][n] is None:
                assert p.grad is None, f"{cls.__name__}: {n}"
            else:
                assert_close(p.grad, ref[0][0][n], msg=lambda m: f"{cls.__name__}: {n}: {m}")


@ws(AT_PROPERTIES)
def test_steps_1_and_2_match_single_process(world_size):
    held(world_size, steps_1_and_2)


def gan_grads(rank, d_hidden, all_reduce=None, g_hook=None, cap=1024, steps=3):
    """Two wrappers in one backward, d(g(z)), as in a GAN; G may have a comm hook."""
    torch.manual_seed(0)
    G = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 8))
    D = nn.Sequential(nn.Linear(8, d_hidden), nn.Tanh(), nn.Linear(d_hidden, 8))
    g = DistributedDataParallel(G, bucket_cap_mb=cap, all_reduce=all_reduce)
    d = DistributedDataParallel(D, bucket_cap_mb=cap, all_reduce=all_reduce)
    if g_hook is not None:
        g.register_comm_hook(*g_hook)
    z = torch.randn(5, 8, generator=torch.Generator().manual_seed(rank))
    for _ in range(steps):
        d(g(z)).pow(2).mean().backward()
    return [p.grad.clone() for p in list(G.parameters()) + list(D.parameters())]


GAN_HIDDEN = {"equal": 16, "unequal": 12}  # D's width: buckets of G and D equal or not


@CASES.case(world_sizes=AT_PROPERTIES, buckets=list(GAN_HIDDEN))
def gan_on_our_all_reduce(rank, world_size, ref, buckets):
    d_hidden = GAN_HIDDEN[buckets]
    assert_close(gan_grads(rank, d_hidden, collectives.all_reduce),
                 gan_grads(rank, d_hidden, None))


@ws(AT_PROPERTIES)
@pytest.mark.parametrize("buckets", list(GAN_HIDDEN))
def test_two_wrappers_in_one_backward_on_our_all_reduce(world_size, buckets):
    held(world_size, gan_on_our_all_reduce, buckets=buckets)


@CASES.case(world_sizes=AT_PROPERTIES)
def gan_powersgd_and_plain(rank, world_size, ref):
    # G's PowerSGD issues collectives from callbacks while D's plain buckets go from backward:
    # one order on every rank (dist_sgd.comm.ordered.in_order), so no mismatch; D's gradients
    # are the plain ones.
    state = compress.PowerSGDState(None, 1, start_powerSGD_iter=2)
    got = gan_grads(rank, 12, g_hook=(state, compress.powerSGD_hook), cap=0, steps=4)
    plain = gan_grads(rank, 12, cap=0, steps=4)
    assert_close(got[4:], plain[4:], rtol=0, atol=0)  # D: the plain all-reduce, untouched
    assert state.iter == 4 and (world_size == 1 or not torch.equal(got[0], plain[0]))


@ws(AT_PROPERTIES)
def test_two_wrappers_one_with_powerSGD_one_plain_in_one_backward(world_size):
    held(world_size, gan_powersgd_and_plain)


@CASES.case(world_sizes=AT_PROPERTIES)
def buffers_and_init_sync(rank, world_size, ref):
    model = make_model(seed=0)
    ddp = DistributedDataParallel(model)
    model.scale.fill_(rank)  # buffers drift apart (BatchNorm statistics would)
    ddp(torch.zeros(2, 6, dtype=torch.float64))
    assert model.scale.eq(0).all(), "broadcast_buffers: rank 0's buffers before forward"
    mine = make_model(seed=rank)
    DistributedDataParallel(mine, init_sync=False)
    assert_close(list(mine.parameters()), list(make_model(seed=rank).parameters()))


@ws(AT_PROPERTIES)
def test_buffers_broadcast_before_forward_and_init_sync(world_size):
    held(world_size, buffers_and_init_sync)


@CASES.case(world_sizes=AT_PROPERTIES)
def hook_contract_errors(rank, world_size, ref):
    def not_a_future(state, bucket):
        return bucket.buffer()

    def wrong_size(state, bucket):
        future = torch.futures.Future()
        future.set_result(torch.zeros(3))
        return future

    for hook, words in ((not_a_future, "not a torch.futures.Future"), (wrong_size, "flat tensor")):
        model = mlp(seed=0)
        ddp = DistributedDataParallel(model)
        ddp.register_comm_hook(None, hook)
        try:
            F.cross_entropy(ddp(torch.randn(2, 12)), torch.tensor([0, 1])).backward()
        except (TypeError, RuntimeError) as error:
            assert words in str(error), str(error)
        else:
            raise AssertionError(f"{hook.__name__}: no error")
        try:
            ddp.register_comm_hook(None, hook)
        except RuntimeError as error:
            assert "only once" in str(error)
        else:
            raise AssertionError("a second register_comm_hook was accepted")
    dist.barrier()


@ws(AT_PROPERTIES)
def test_a_hook_that_breaks_the_contract_is_named(world_size):
    held(world_size, hook_contract_errors)


def mlp(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(),
                         nn.Linear(16, 5))


# ---- equal to torch's DDP, bit for bit (Odd, float32) ------------------------------------------

class Odd(nn.Module):
    """Odd shapes (a 3x3 conv of 5 channels, 45 -> 37 -> 45 -> 7), a frozen layer, a weight
    used twice (tied: mid.weight, then its transpose) and a layer used only sometimes."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 5, 3)
        self.frozen = nn.Linear(45, 45).requires_grad_(False)
        self.mid = nn.Linear(45, 37)
        self.extra = nn.Linear(37, 37)
        self.head = nn.Linear(45, 7)

    def forward(self, x, use_extra=True):
        h = torch.tanh(self.frozen(torch.tanh(self.conv(x)).flatten(1)))
        h = torch.tanh(self.mid(h))
        if use_extra:
            h = h + torch.tanh(self.extra(h))
        return self.head(torch.tanh(F.linear(h, self.mid.weight.t())))


TORCH_STEPS = 3  # step 0 in one bucket; the rebuilt buckets from step 1; momentum carries on


def odd_run(wrap, rank, unused, hook=None):
    """TORCH_STEPS steps of Odd under wrap(module); per step {name: grad or None}."""
    torch.manual_seed(rank)  # ranks start different: the wrapper broadcasts rank 0's
    model = Odd()
    ddp = wrap(model)
    if hook is not None:
        ddp.register_comm_hook(*hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    grads = []
    for step in range(TORCH_STEPS):
        g = torch.Generator().manual_seed(10 * step + rank)
        x, y = torch.randn(6, 3, 5, 5, generator=g), torch.randint(0, 7, (6,), generator=g)
        opt.zero_grad()
        F.cross_entropy(ddp(x, uses_extra(step, rank) if unused else True), y).backward()
        grads.append({n: None if p.grad is None else p.grad.clone()
                      for n, p in model.named_parameters()})
        opt.step()
    dist.barrier()  # torch quirk: no rank goes on while a peer's reducer is finishing
    return grads


# What torch's DDP is compared on: (bucket_cap_mb, unused layer?). With a layer some ranks
# skip, torch needs find_unused_parameters=True (buckets kept as built); without, its default
# (one bucket first, then rebuilt in gradient-ready order).
LAYOUTS = {"default": None, "4 KB": 4 / 1024, "per parameter": 0}
TORCH_HOOKS = {"no hook": None, "allreduce_hook": default_hooks.allreduce_hook,
               "fp16_compress_hook": default_hooks.fp16_compress_hook}
BUCKETS = {False: "rebuilt", True: "unused"}  # find_unused_parameters -> the test's id


@functools.lru_cache(maxsize=None)  # per rank process: torch's run, shared by the cases
def torch_odd_run(rank, cap, unused, hook_name, static_graph=False):
    hook = TORCH_HOOKS[hook_name]
    return odd_run(lambda m: TorchDDP(m, bucket_cap_mb=cap, find_unused_parameters=unused,
                                      static_graph=static_graph),
                   rank, unused, None if hook is None else (None, hook))


@CASES.case(world_sizes=AT_TORCH, layout=list(LAYOUTS), unused=[False, True])
def core_vs_torch(rank, world_size, ref, layout, unused):
    cap = LAYOUTS[layout]
    ours = odd_run(lambda m: BucketedDDP(m, cap, rebuild_after=None if unused else 1), rank,
                   unused)
    same(ours, torch_odd_run(rank, cap, unused, "no hook"), "core vs torch DDP", rtol=0, atol=0)


@ws(AT_TORCH)
@pytest.mark.parametrize("unused", list(BUCKETS), ids=list(BUCKETS.values()))
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_core_grads_equal_torch_ddp_bit_for_bit(world_size, layout, unused):
    held(world_size, core_vs_torch, layout=layout, unused=unused)


# Odd is 14 KB: the default layout (first bucket 1 MiB) is one bucket, which the hooks meet at
# step 0 anyway; with hooks, the layouts of several buckets.
HOOK_LAYOUTS = ["4 KB", "per parameter"]


def ours_vs_torch(rank, world_size, ref, layout, unused, hook_name):
    cap, hook = LAYOUTS[layout], TORCH_HOOKS[hook_name]
    ours = odd_run(lambda m: DistributedDataParallel(m, cap, find_unused_parameters=unused),
                   rank, unused, None if hook is None else (None, hook))
    same(ours, torch_odd_run(rank, cap, unused, hook_name), "ours vs torch DDP",
         rtol=0, atol=0)
    if hook_name == "fp16_compress_hook" and world_size > 1:  # fp16 differs from float32
        plain = torch_odd_run(rank, cap, unused, "no hook")
        assert not torch.equal(plain[1]["head.weight"], ours[1]["head.weight"])


CASES.case(world_sizes=AT_TORCH, layout=list(LAYOUTS), unused=[False, True],
           hook_name=["no hook"])(ours_vs_torch)
CASES.case(world_sizes=AT_TORCH, layout=HOOK_LAYOUTS, unused=[False, True],
           hook_name=["allreduce_hook", "fp16_compress_hook"])(ours_vs_torch)


@ws(AT_TORCH)
@pytest.mark.parametrize("unused", list(BUCKETS), ids=list(BUCKETS.values()))
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_our_ddp_grads_equal_torch_ddp_bit_for_bit(world_size, layout, unused):
    held(world_size, ours_vs_torch, layout=layout, unused=unused, hook_name="no hook")


@ws(AT_TORCH)
@pytest.mark.parametrize("hook", ["allreduce_hook", "fp16_compress_hook"])
@pytest.mark.parametrize("unused", list(BUCKETS), ids=list(BUCKETS.values()))
@pytest.mark.parametrize("layout", HOOK_LAYOUTS)
def test_torch_hooks_on_our_ddp_equal_torch_ddp_bit_for_bit(world_size, layout, unused, hook):
    held(world_size, ours_vs_torch, layout=layout, unused=unused, hook_name=hook)


def test_torch_fp16_compress_hook_on_our_ddp_equals_torch_ddp_bit_for_bit_ws3_4kb_buckets():
    # The named result: world size 3 (gloo adds three float16 numbers in an order set by their
    # place in the bucket), 4 KB buckets, TORCH_STEPS steps, so the rebuilt buckets are used.
    held(3, ours_vs_torch, layout="4 KB", unused=False, hook_name="fp16_compress_hook")


@CASES.case(world_sizes=AT_TORCH, layout=HOOK_LAYOUTS)
def static_graph_vs_torch(rank, world_size, ref, layout):
    # torch's static_graph=True: its first backward only records the graph, so the buckets are
    # rebuilt after the second: step 1 still adds one bucket (gloo's order of adding differs
    # from the rebuilt buckets' at world size 3), step 2 the rebuilt ones.
    cap = LAYOUTS[layout]
    ours = odd_run(lambda m: DistributedDataParallel(m, cap, static_graph=True), rank, False)
    same(ours, torch_odd_run(rank, cap, False, "no hook", static_graph=True),
         "ours vs torch DDP, static_graph", rtol=0, atol=0)


@ws(AT_TORCH)
@pytest.mark.parametrize("layout", HOOK_LAYOUTS)
def test_static_graph_grads_equal_torch_ddp_bit_for_bit(world_size, layout):
    held(world_size, static_graph_vs_torch, layout=layout)


def hook_view_run(wrap, model, rank, x, steps=3):
    """Per step, what a communication hook sees of each bucket: (index, parameter names,
    dtype); and the gradients of every step."""
    names = {p: n for n, p in model.named_parameters()}
    ddp, seen, grads = wrap(model), [], []

    def recording(state, bucket):
        seen[-1].append((bucket.index(), [names[p] for p in bucket.parameters()],
                         bucket.buffer().dtype))
        return default_hooks.allreduce_hook(state, bucket)

    ddp.register_comm_hook(None, recording)
    for _ in range(steps):
        seen.append([])
        model.zero_grad()
        ddp(x).float().sum().backward()
        seen[-1].sort(key=lambda s: s[0])  # launch order is the bucket order anyway
        grads.append([p.grad.clone() for p in model.parameters()])
    dist.barrier()
    return seen, grads


LAYOUT_RUNS = {  # name -> (bucket_cap_mb, find_unused_parameters, static_graph)
    "default": (None, False, False), "4 KB": (4 / 1024, False, False),
    "per parameter": (0, False, False), "default, unused": (None, True, False),
    "4 KB, unused": (4 / 1024, True, False), "per parameter, unused": (0, True, False),
    "default, static graph": (None, False, True), "4 KB, static graph": (4 / 1024, False, True),
}


def sequential(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(512, 512), nn.Tanh(), nn.Linear(512, 512), nn.Tanh(),
                         nn.Linear(512, 10))  # 3 MiB: a 1 MiB first bucket shows


@CASES.case(world_sizes=[3], layout=list(LAYOUT_RUNS))
def layout_vs_torch(rank, world_size, ref, layout):
    cap, unused, static = LAYOUT_RUNS[layout]
    kw = dict(bucket_cap_mb=cap, find_unused_parameters=unused, static_graph=static)
    x = torch.randn(4, 512, generator=torch.Generator().manual_seed(rank))
    ours, _ = hook_view_run(lambda m: DistributedDataParallel(m, **kw), sequential(rank), rank, x)
    theirs, _ = hook_view_run(lambda m: TorchDDP(m, **kw), sequential(rank), rank, x)
    assert ours == theirs, f"ours {ours}\ntorch's {theirs}"
    if cap is None and not unused:  # torch's default: 25 MiB, the first bucket 1 MiB
        assert len(ours[-1]) == 2 and ours[-1][0][1][-1] == "2.weight", ours[-1]
    if static:  # rebuilt one step later than without a static graph
        assert ours[1] == ours[0] != ours[2], ours


@pytest.mark.parametrize("layout", list(LAYOUT_RUNS))
def test_buckets_are_torchs_at_every_step(layout):
    held(3, layout_vs_torch, layout=layout)  # rank 0's ready order, broadcast: any world size


class TwoDtypes(nn.Module):
    """float64 and float32 layers, one after the other: buckets of two dtypes."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 8).double()
        self.b = nn.Linear(8, 8)
        self.c = nn.Linear(8, 8).double()
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        h = torch.tanh(self.b(torch.tanh(self.a(x)).float()))
        return self.head(torch.tanh(self.c(h.double())).float())


@CASES.case(world_sizes=[1, 3], cap=[None, 600 / 2 ** 20])
def dtypes_vs_torch(rank, world_size, ref, cap):
    # After the rebuild torch's partly filled buckets come in reverse order of their dtype's
    # first gradient: the head's float32 gradient is ready first, so with the default cap
    # float64 is bucket 0; with 600 B buckets the partly filled float64 one (a.weight) comes
    # before the partly filled float32 one.
    x = torch.randn(4, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(rank))

    def model():
        torch.manual_seed(rank)
        return TwoDtypes()

    ours, ours_grads = hook_view_run(lambda m: DistributedDataParallel(m, cap), model(), rank, x)
    theirs, their_grads = hook_view_run(lambda m: TorchDDP(m, bucket_cap_mb=cap), model(), rank, x)
    assert ours == theirs, f"ours {ours}\ntorch's {theirs}"
    if cap is None:
        assert ours[-1][0][2] == torch.float64, ours[-1]
    for a, b in zip(ours_grads, their_grads):
        assert_close(a, b, rtol=0, atol=0)


@ws([1, 3])
@pytest.mark.parametrize("cap", [None, 600 / 2 ** 20], ids=["default", "600 B"])
def test_buckets_of_two_dtypes_have_torchs_indices(world_size, cap):
    held(world_size, dtypes_vs_torch, cap=cap)


@CASES.case(world_sizes=AT_TORCH)
def buffers_vs_torch(rank, world_size, ref):
    # torch broadcasts rank 0's buffers before a forward only if the forward before it set up
    # a backward that synchronizes: after a forward inside no_sync(), or one under no_grad()
    # (train mode: BatchNorm still updates its statistics), each rank keeps its own.
    def run(wrap):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Linear(6, 2))
        ddp, seen = wrap(model), []
        for step in range(6):
            x = torch.randn(5, 4, generator=torch.Generator().manual_seed(10 * step + rank))
            if step == 1:
                with ddp.no_sync():
                    ddp(x).sum().backward()
            elif step == 3:
                with torch.no_grad():
                    ddp(x)
            else:
                ddp(x).sum().backward()
            seen.append([b.clone() for b in model.buffers()])
        dist.barrier()
        return seen

    ours, theirs = run(DistributedDataParallel), run(TorchDDP)
    for step, (a, b) in enumerate(zip(ours, theirs)):
        assert_close(a, b, rtol=0, atol=0, msg=lambda m: f"buffers after step {step}: {m}")


@ws(AT_TORCH)
def test_buffers_broadcast_when_torch_broadcasts_them(world_size):
    held(world_size, buffers_vs_torch)


# ---- PowerSGD on several buckets ------------------------------------------------------------

def torch_powerSGD_in_order(state, bucket):
    """torch's powerSGD_hook, one bucket at a time (else, on gloo with several buckets, its
    callbacks' all-reduces race with the next bucket's: a hang or an abort)."""
    return in_order(lambda: psgd.powerSGD_hook(state, bucket))


HOOK_STEPS, POWERSGD_START = 6, 2  # powerSGD compresses from step 2 on: 4 compressed steps


def hooked_run(cls, state, hook, rank, **kwargs):
    """HOOK_STEPS steps of SGD on float32 gradients of full rank; every step's gradients."""
    model = mlp(seed=rank)  # ranks start different: the wrapper broadcasts rank 0's
    ddp = cls(model, **kwargs)
    if hook is not None:
        ddp.register_comm_hook(state, hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    grads = []
    for step in range(HOOK_STEPS):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x, y = torch.randn(8, 12, generator=g), torch.randint(0, 5, (8,), generator=g)
        opt.zero_grad()
        F.cross_entropy(ddp(x), y).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        opt.step()
    dist.barrier()  # torch quirk: no rank goes on while a peer's reducer is finishing
    return grads, len(ddp.buckets) if cls is not TorchDDP else None


def same_steps(got, want):
    for step, (a, b) in enumerate(zip(got, want)):
        for i, (x, y) in enumerate(zip(a, b)):
            assert torch.equal(x, y), f"step {step}, parameter {i}: {(x - y).abs().max()}"


POWERSGD_CAPS = {"one bucket": 1024, "several buckets": 0.5 / 1024}


@CASES.case(world_sizes=[2, 3], matrix_rank=[1, 2], cap=list(POWERSGD_CAPS))
def powersgd_vs_torch(rank, world_size, ref, matrix_rank, cap):
    def state():
        return psgd.PowerSGDState(process_group=None, matrix_approximation_rank=matrix_rank,
                                  start_powerSGD_iter=POWERSGD_START, random_seed=0)
    mb = POWERSGD_CAPS[cap]
    # torch's hook, run one bucket at a time on torch's DDP, against the same hook on ours
    want, _ = hooked_run(TorchDDP, state(), torch_powerSGD_in_order, rank, bucket_cap_mb=mb)
    got, buckets = hooked_run(DistributedDataParallel, state(), psgd.powerSGD_hook, rank,
                              bucket_cap_mb=mb)
    assert (buckets > 1) == (mb < 1), f"{buckets} buckets at bucket_cap_mb={mb}"
    same_steps(got, want)
    # Before its start, torch's powerSGD_hook is its allreduce_hook (divide, then sum; no
    # hook multiplies by 1/p while copying: at world size 3 the last bit can differ).
    plain, _ = hooked_run(DistributedDataParallel, None, default_hooks.allreduce_hook, rank,
                          bucket_cap_mb=mb)
    same_steps(got[:POWERSGD_START], plain[:POWERSGD_START])
    if world_size > 1:  # after: a low-rank approximation (one rank: nothing to compress)
        assert (got[POWERSGD_START][0] - plain[POWERSGD_START][0]).abs().max() > 1e-3


@ws([2, 3])
@pytest.mark.parametrize("cap", list(POWERSGD_CAPS))
@pytest.mark.parametrize("matrix_rank", [1, 2])
def test_torch_powerSGD_hook_on_our_ddp_equals_torch_ddp(world_size, matrix_rank, cap):
    held(world_size, powersgd_vs_torch, matrix_rank=matrix_rank, cap=cap)


# ---- without a process group ----------------------------------------------------------------

def test_bucket_assignment_follows_torch():
    ts = [torch.empty(n // 4) for n in (40, 1200, 20, 4000)]  # bytes, float32
    mixed = [t.to(dtype) for t, dtype in zip(ts, [torch.float32, torch.float64] * 2)]
    assert assign_buckets(ts, [float("inf")]) == [[0, 1, 2, 3]]
    assert assign_buckets(ts, [0]) == [[0], [1], [2], [3]]
    # 1,300-byte cap: 40 + 1200 >= 1300? no; + 20: still no; + 4000 closes: one bucket
    assert assign_buckets(ts, [1300]) == [[0, 1, 2, 3]]
    assert assign_buckets(ts, [1000]) == [[0, 1], [2, 3]]
    # the first bucket capped lower than the rest (torch's 1 MiB first bucket)
    assert assign_buckets(ts, [30, 5000]) == [[0], [1, 2, 3]]
    # two dtypes never share a bucket; each dtype's first bucket has the first cap
    assert assign_buckets(mixed, [50, 5000]) == [[1], [0, 2], [3]]
    # open buckets of several dtypes: the dtype seen first comes last
    assert assign_buckets(mixed, [float("inf")]) == [[1, 3], [0, 2]]


DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def test_bucket_assignment_equals_torchs_own_function():
    # torch's reducer assigns buckets with dist._compute_bucket_assignment_by_size (C++): given
    # the tensors in gradient-ready order (a rebuild), ours must give the same lists of
    # positions, also for several dtypes whose last buckets stay partly filled.
    g = torch.Generator().manual_seed(0)
    for trial in range(300):
        n = int(torch.randint(1, 9, (1,), generator=g))
        kinds = int(torch.randint(1, len(DTYPES) + 1, (1,), generator=g))
        ts = [torch.empty(int(torch.randint(1, 30, (1,), generator=g)),
                          dtype=DTYPES[int(torch.randint(0, kinds, (1,), generator=g))])
              for _ in range(n)]
        for caps in ([float("inf")], [60], [40, 200], [100, 50], [16, 64]):
            torch_caps = [min(c, 2 ** 62) for c in caps]
            theirs, _ = dist._compute_bucket_assignment_by_size(ts, torch_caps, [False] * n,
                                                                list(range(n)))
            assert assign_buckets(ts, caps) == theirs, ([t.dtype for t in ts], caps)


def test_needs_a_process_group():
    with pytest.raises(RuntimeError, match="process group"):
        DistributedDataParallel(nn.Linear(2, 2))
    with pytest.raises(RuntimeError, match="process group"):
        BucketedDDP(nn.Linear(2, 2))


@pytest.mark.parametrize("argument, value", [
    ("gradient_as_bucket_view", True), ("process_group", object()), ("mixed_precision", object()),
    ("device_mesh", object()), ("skip_all_reduce_unused_params", True),
    ("bucket_cap_mb_list", [1, 2]), ("delay_all_reduce_named_params", [])])
def test_torch_arguments_we_cannot_honour_are_refused_by_name(argument, value):
    with pytest.raises(ValueError, match=argument):
        DistributedDataParallel(nn.Linear(2, 2), **{argument: value})


def test_device_ids_positional_and_unknown_arguments_are_refused_clearly():
    with pytest.raises(TypeError, match="device_ids"):
        DistributedDataParallel(nn.Linear(2, 2), [0])
    with pytest.raises(TypeError, match="no_such_argument"):
        DistributedDataParallel(nn.Linear(2, 2), no_such_argument=1)
    with pytest.raises(ValueError, match="device_ids"):
        DistributedDataParallel(nn.Linear(2, 2), device_ids=[0, 1])
    with pytest.raises(ValueError, match="device_ids"):
        DistributedDataParallel(nn.Linear(2, 2), device_ids=["cuda:0"])  # module is on the CPU
    with pytest.raises(ValueError, match="bucket_cap_mb"):
        DistributedDataParallel(nn.Linear(2, 2), bucket_cap_mb=-1)
    with pytest.raises(ValueError, match="sparse"):
        DistributedDataParallel(nn.Embedding(5, 2, sparse=True))
