"""Our DistributedDataParallel (and steps 1-2 of lesson 07), one named test per property.

A spawn costs seconds, so one launch() per world size (1, 2, 3) runs every case inside the
ranks (module-scoped fixture) and returns, per rank, a dict: case name -> None when it held,
else the message of the assertion that failed. Each test below reads one case.

The model has every awkward part at once: a frozen layer, a Parameter shared by two layers
(tied weights), a buffer, and a layer that some ranks use in some steps and no rank in others.
Everything is float64, so the tolerances can stay tight.
"""
import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook as psgd
from torch.nn.parallel import DistributedDataParallel as TorchDDP
from torch.testing import assert_close

from dist_sgd.comm import collectives
from dist_sgd.ddp.ddp import DistributedDataParallel, assign_buckets
from dist_sgd.ddp.steps import HookDDP, NaiveDDP
from dist_sgd.plumbing.launch import launch

PER_RANK = 4
STEPS = 3
CAPS = {"one bucket": None, "per parameter": 0, "tiny": 0.0002, "default": 25.0}


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


def same(got, expected, what):
    for step, (g, e) in enumerate(zip(got, expected)):
        for name in e:
            if e[name] is None or g[name] is None:
                assert g[name] is None and e[name] is None, \
                    f"{what}: step {step}: {name}: {g[name]} vs {e[name]}"
            else:
                assert_close(g[name], e[name], msg=lambda m: f"{what}: step {step}: {name}: {m}")


# ---- the cases, run inside every rank -----------------------------------------------------------

def case_broadcast(rank, world_size, ref):
    model = make_model(seed=rank)  # ranks start from different weights ...
    DistributedDataParallel(model)
    for a, b in zip(model.state_dict().values(), make_model(0).state_dict().values()):
        assert_close(a, b)  # ... and end up with rank 0's


def case_cap(cap, what):
    def case(rank, world_size, ref):
        model = make_model(seed=rank)
        got = train(DistributedDataParallel(model, bucket_cap_mb=cap), model, rank, world_size)
        same(got[0], ref[0], f"grads, {what}")
        same(got[1], ref[1], f"weights, {what}")
    return case


def case_torch_ddp(rank, world_size, ref):
    ours, theirs = make_model(seed=rank), make_model(seed=rank)
    got = train(DistributedDataParallel(ours, bucket_cap_mb=CAPS["tiny"]), ours, rank, world_size)
    want = train(TorchDDP(theirs, find_unused_parameters=True), theirs, rank, world_size)
    dist.barrier()  # torch quirk: no rank goes on while a peer's reducer is finishing
    same(got[0], want[0], "ours vs torch DDP")


def case_unused(rank, world_size, ref):
    model = make_model(seed=rank)
    grads, _ = train(DistributedDataParallel(model, bucket_cap_mb=0), model, rank, world_size)
    assert grads[2]["extra.weight"] is None, "a parameter no rank used got a gradient"
    assert grads[1]["extra.weight"] is not None, "a parameter rank 0 used got none"


def case_frozen_and_tied(rank, world_size, ref):
    model = make_model(seed=rank)
    ddp = DistributedDataParallel(model, bucket_cap_mb=0)
    members = [id(p) for b in ddp.buckets for p in b.params]
    assert len(members) == len(set(members)), "a parameter sits in two buckets"
    assert id(model.mid.weight) in members and id(model.frozen.weight) not in members
    assert len(members) == sum(p.requires_grad for p in model.parameters())
    grads, _ = train(ddp, model, rank, world_size)
    assert grads[0]["frozen.weight"] is None, "a frozen parameter got a gradient"
    assert_close(grads[0]["mid.weight"], ref[0][0]["mid.weight"])  # both uses, summed once


def case_each_bucket_once(rank, world_size, ref):
    calls = []

    def counting_all_reduce(t):
        calls.append(t.data_ptr())
        dist.all_reduce(t)

    model = make_model(seed=rank)
    ddp = DistributedDataParallel(model, bucket_cap_mb=CAPS["tiny"], all_reduce=counting_all_reduce)
    assert len(ddp.buckets) > 2
    x, y = batch(0, world_size)
    for step in range(2):
        calls.clear()
        F.cross_entropy(ddp(shard(x, rank, world_size)), shard(y, rank, world_size)).backward()
        assert sorted(calls) == sorted(b.flat.data_ptr() for b in ddp.buckets), \
            f"step {step}: {len(calls)} all-reduces for {len(ddp.buckets)} buckets"
        ddp.finish_gradient_synchronization()  # again: nothing more may be sent
        assert len(calls) == len(ddp.buckets)


def case_our_all_reduce(rank, world_size, ref):
    model = make_model(seed=rank)
    ddp = DistributedDataParallel(model, bucket_cap_mb=CAPS["tiny"],
                                  all_reduce=collectives.all_reduce)
    same(train(ddp, model, rank, world_size)[0], ref[0], "ours + our all_reduce")


def case_no_sync(rank, world_size, ref):
    # Two local backward passes, then a synced one == one batch three times larger. The extra
    # layer is used in the first (local) pass only: the synced pass must still send its
    # accumulated gradient, not zeros.
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


def case_overlap(rank, world_size, ref):
    model = make_model(seed=rank)
    ddp = DistributedDataParallel(model, bucket_cap_mb=0)
    ddp.trace = []
    x, y = batch(0, world_size)
    F.cross_entropy(ddp(shard(x, rank, world_size)), shard(y, rank, world_size)).backward()
    events = [e["event"] for e in ddp.trace]
    last_hook = len(events) - 1 - events[::-1].index("hook")
    assert events.index("launch") < last_hook, events
    assert events.count("done") == len(ddp.buckets) and events[-1] == "synchronized", events


def case_steps_1_and_2(rank, world_size, ref):
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


def gan_grads(rank, d_hidden, all_reduce):
    """Issue 9, bug 1: two wrappers in one backward, d(g(z)), as in a GAN."""
    torch.manual_seed(0)
    G = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 8))
    D = nn.Sequential(nn.Linear(8, d_hidden), nn.Tanh(), nn.Linear(d_hidden, 8))
    g = DistributedDataParallel(G, bucket_cap_mb=None, all_reduce=all_reduce)
    d = DistributedDataParallel(D, bucket_cap_mb=None, all_reduce=all_reduce)
    z = torch.randn(5, 8, generator=torch.Generator().manual_seed(rank))
    for _ in range(3):
        d(g(z)).pow(2).mean().backward()
    return [p.grad.clone() for p in list(G.parameters()) + list(D.parameters())]


def case_gan(d_hidden):
    def case(rank, world_size, ref):
        assert_close(gan_grads(rank, d_hidden, collectives.all_reduce),
                     gan_grads(rank, d_hidden, None))
    return case


def case_buffers(rank, world_size, ref):
    model = make_model(seed=0)
    ddp = DistributedDataParallel(model)
    model.scale.fill_(rank)  # buffers drift apart (BatchNorm statistics would)
    ddp(torch.zeros(2, 6, dtype=torch.float64))
    assert model.scale.eq(0).all(), "broadcast_buffers: rank 0's buffers before forward"
    mine = make_model(seed=rank)
    DistributedDataParallel(mine, init_sync=False)
    assert_close(list(mine.parameters()), list(make_model(seed=rank).parameters()))


# ---- communication hooks: torch's own hooks on ours give torch DDP's gradients --------------
# register_comm_hook(state, hook) follows torch's contract (hook(state, bucket) returns a Future
# of the bucket's reduced flat gradient; `bucket` has GradBucket's methods), so torch's
# default_hooks.allreduce_hook, fp16_compress_hook and powerSGD_hook run on ours unchanged.
# powerSGD runs with one bucket: torch 2.14.1's powerSGD_hook on gloo can hang with several
# small buckets (its callbacks issue collectives from gloo's thread while the next bucket's
# hook issues them from the main thread).

HOOK_STEPS, POWERSGD_START = 6, 2  # powerSGD compresses from step 2 on: 4 compressed steps


def mlp(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(),
                         nn.Linear(16, 5))


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
    return grads


def same_steps(got, want, exact=False, **tolerance):
    for step, (a, b) in enumerate(zip(got, want)):
        for i, (x, y) in enumerate(zip(a, b)):
            if exact:
                assert torch.equal(x, y), f"step {step}, parameter {i}: {(x - y).abs().max()}"
            else:
                assert_close(x, y, **tolerance, msg=lambda m: f"step {step}, parameter {i}: {m}")


# torch's buckets for the same layout as ours: "one bucket"; "per parameter" needs
# find_unused_parameters=True, which keeps torch from re-bucketing after step 0.
TORCH_LAYOUT = {None: dict(bucket_cap_mb=25),
                0: dict(bucket_cap_mb=1e-6, find_unused_parameters=True)}


def case_hook(hook, cap, exact=False, **tolerance):
    def case(rank, world_size, ref):
        want = hooked_run(TorchDDP, None, hook, rank, **TORCH_LAYOUT[cap])
        got = hooked_run(DistributedDataParallel, None, hook, rank, bucket_cap_mb=cap)
        same_steps(got, want, exact, **tolerance)
        if hook is default_hooks.fp16_compress_hook:  # fp16 must differ from float32 at all
            plain = hooked_run(DistributedDataParallel, None, None, rank, bucket_cap_mb=cap)
            assert world_size == 1 or not torch.equal(plain[1][0], got[1][0])
    return case


def case_fp16_one_bucket(rank, world_size, ref):
    # Bit for bit at world size 2. At 3, gloo adds three float16 numbers in an order that
    # depends on the element's place in the bucket, and torch's step-0 bucket holds the
    # parameters in forward order (ours, and torch's later steps: the order gradients arrive):
    # the last bits of step 0 differ, and so every step after it, by float16 rounding.
    case_hook(default_hooks.fp16_compress_hook, None, exact=world_size <= 2,
              rtol=2e-3, atol=1e-4)(rank, world_size, ref)  # float16: eps = 9.8e-4


def case_powersgd(matrix_rank):
    def case(rank, world_size, ref):
        def state():
            return psgd.PowerSGDState(process_group=None, matrix_approximation_rank=matrix_rank,
                                      start_powerSGD_iter=POWERSGD_START, random_seed=0)
        want = hooked_run(TorchDDP, state(), psgd.powerSGD_hook, rank, bucket_cap_mb=25)
        got = hooked_run(DistributedDataParallel, state(), psgd.powerSGD_hook, rank,
                         bucket_cap_mb=None)
        same_steps(got, want)
        plain = hooked_run(DistributedDataParallel, None, None, rank, bucket_cap_mb=None)
        same_steps(got[:POWERSGD_START], plain[:POWERSGD_START])  # before: a plain all-reduce
        if world_size > 1:  # after: a low-rank approximation (one rank: nothing to compress)
            assert (got[POWERSGD_START][0] - plain[POWERSGD_START][0]).abs().max() > 1e-3
    return case


def case_hook_contract_errors(rank, world_size, ref):
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


CASES = {
    "broadcast": case_broadcast,
    **{f"cap {name}": case_cap(cap, name) for name, cap in CAPS.items()},
    "torch ddp": case_torch_ddp,
    "unused": case_unused,
    "frozen and tied": case_frozen_and_tied,
    "each bucket once": case_each_bucket_once,
    "our all_reduce": case_our_all_reduce,
    "no_sync": case_no_sync,
    "overlap": case_overlap,
    "steps 1 and 2": case_steps_1_and_2,
    "gan equal buckets": case_gan(16),
    "gan unequal buckets": case_gan(12),
    "buffers and init_sync": case_buffers,
    "allreduce hook, one bucket": case_hook(default_hooks.allreduce_hook, None),
    "allreduce hook, per parameter": case_hook(default_hooks.allreduce_hook, 0),
    "fp16 hook, per parameter": case_hook(default_hooks.fp16_compress_hook, 0, exact=True),
    "fp16 hook, one bucket": case_fp16_one_bucket,
    "powerSGD rank 1": case_powersgd(1),
    "powerSGD rank 2": case_powersgd(2),
    "hook contract errors": case_hook_contract_errors,
}


def all_cases(rank, world_size):
    ref = reference_run(world_size)
    out = {}
    for name, case in CASES.items():
        try:
            case(rank, world_size, ref)
            out[name] = None
        except Exception as error:  # noqa: BLE001 - reported by the test that reads this case
            out[name] = f"rank {rank}: {type(error).__name__}: {error}"
    dist.barrier()
    return out


@pytest.fixture(scope="module", params=[1, 2, 3], ids=lambda ws: f"ws{ws}")
def results(request):
    return launch(all_cases, request.param, backend="gloo")


def held(results, name):
    failures = [r[name] for r in results if r[name] is not None]
    assert not failures, "\n".join(failures)


def test_ranks_start_from_rank_0s_weights(results):
    held(results, "broadcast")


@pytest.mark.parametrize("cap", list(CAPS))
def test_grads_match_single_process_each_step(results, cap):
    held(results, f"cap {cap}")


def test_grads_match_torch_ddp_each_step(results):
    held(results, "torch ddp")


def test_unused_param_grad_stays_none(results):
    held(results, "unused")


def test_frozen_param_skipped_and_tied_param_reduced_once(results):
    held(results, "frozen and tied")


def test_each_bucket_reduced_once(results):
    held(results, "each bucket once")


def test_our_all_reduce_gives_the_same_grads(results):
    held(results, "our all_reduce")


def test_no_sync_accumulates(results):
    held(results, "no_sync")


def test_first_all_reduce_starts_before_backward_ends(results):
    held(results, "overlap")


def test_steps_1_and_2_match_single_process(results):
    held(results, "steps 1 and 2")


@pytest.mark.parametrize("buckets", ["equal", "unequal"])
def test_two_wrappers_in_one_backward_on_our_all_reduce(results, buckets):
    held(results, f"gan {buckets} buckets")


def test_buffers_broadcast_before_forward_and_init_sync(results):
    held(results, "buffers and init_sync")


@pytest.mark.parametrize("layout", ["one bucket", "per parameter"])
def test_torch_allreduce_hook_matches_torch_ddp(results, layout):
    held(results, f"allreduce hook, {layout}")


def test_torch_fp16_compress_hook_matches_torch_ddp_bit_for_bit(results):
    held(results, "fp16 hook, per parameter")


def test_torch_fp16_compress_hook_one_bucket_matches_torch_ddp(results):
    held(results, "fp16 hook, one bucket")


@pytest.mark.parametrize("matrix_rank", [1, 2])
def test_torch_powerSGD_hook_matches_torch_ddp_past_start(results, matrix_rank):
    held(results, f"powerSGD rank {matrix_rank}")


def test_a_hook_that_breaks_the_contract_is_named(results):
    held(results, "hook contract errors")


# ---- without a process group ----------------------------------------------------------------

def test_bucket_assignment():
    params = [(f"p{i}", nn.Parameter(torch.zeros(n))) for i, n in enumerate([10, 300, 5, 1000])]
    names = lambda groups: [[n for n, _ in g] for g in groups]  # noqa: E731
    assert names(assign_buckets(params, None)) == [["p3", "p2", "p1", "p0"]]
    assert names(assign_buckets(params, 0)) == [["p3"], ["p2"], ["p1"], ["p0"]]
    # 1,300-byte cap: p3 (4,000 bytes) closes a bucket alone; p2 + p1 + p0 (1,260) stay open
    assert names(assign_buckets(params, 1300 / 2 ** 20)) == [["p3"], ["p2", "p1", "p0"]]
    with pytest.raises(ValueError, match="bucket_cap_mb"):
        assign_buckets(params, -1)


def test_needs_a_process_group():
    with pytest.raises(RuntimeError, match="process group"):
        DistributedDataParallel(nn.Linear(2, 2))


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
