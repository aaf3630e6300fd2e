"""Our communication hooks (dist_sgd.ddp.compress) against torch's, on torch's DDP and on ours.

One launch() per world size (2 and 3) runs every configuration; the small tests below read
its results. Each configuration trains identical models side by side on the same batches for
STEPS steps (PowerSGD starts at step START): the reference, torch's hook on torch's DDP, then
our hook on torch's DDP and our hook on our DDP (dist_sgd.ddp.ddp), and records every gradient
DDP hands back plus the hook's memory. (torch's hooks on our DDP: tests/test_ddp.py.)

Two layouts: one bucket, and several buckets (both DDPs build the same ones, torch's rules).
On several buckets torch's powerSGD_hook, on torch's DDP and gloo, can hang or abort (its
callbacks' all-reduces race with the next bucket's), so the reference runs it one bucket at a
time (dist_sgd.comm.ordered.in_order); ours orders itself.

The model's gradient matrices are full rank (batch 24 per rank > every layer's width, and a
regression loss: cross-entropy's last-layer gradient has rows summing to zero), so
PowerSGD at rank 1 or 2 really drops something: equal results are not the lossless case.
The conv weight (4 x 2 x 3 x 3, seen as a 4 x 18 matrix) and `side` (4 x 18) have the same
matrix shape but sit far apart: torch lays its P's and Q's out grouped by shape and the random
Q's depend on that order. Both are compressed at rank 1 but not at rank 2 (min_compression_rate).
"""
import pytest
import torch
import torch.distributed as dist
import torch.distributed.algorithms.ddp_comm_hooks.default_hooks as torch_default
import torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook as torch_powersgd
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as TorchDDP
from torch.testing import assert_close

from dist_sgd.comm.ordered import in_order
from dist_sgd.ddp import compress
from dist_sgd.ddp.ddp import DistributedDataParallel
from dist_sgd.ddp.grad_bucket import GradBucket
from dist_sgd.plumbing.launch import launch
from dist_sgd.scale.costmodel import link, predict_compressed_step, predict_step

PER_RANK = 24
STEPS = 5
START = 2
POWERSGD = {  # name -> (matrix_approximation_rank, use_error_feedback, warm_start)
    "rank 1": (1, True, True),
    "rank 2": (2, True, True),
    "rank 1, no error feedback": (1, False, True),
    "rank 2, no error feedback": (2, False, True),
    "rank 1, no warm start": (1, True, False),
    "rank 2, no warm start": (2, True, False),
    "rank 1, neither": (1, False, False),
    "rank 2, neither": (2, False, False),
    "rank 4 (QR)": (4, True, True),
}
# (configuration, layout): every PowerSGD setting on several buckets; two on one bucket too.
LAYOUTS = {"one bucket": 1000, "several buckets": 2 / 1024}  # Model: 8.3 KB -> 5 buckets
CONFIGS = [("allreduce", "one bucket"), ("fp16", "one bucket"), ("allreduce", "several buckets"),
           ("fp16", "several buckets"), ("rank 1", "one bucket"), ("rank 2", "one bucket")] + \
    [(name, "several buckets") for name in POWERSGD]


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3)        # weight 4 x 2 x 3 x 3 -> a 4 x 18 matrix
        self.fc1 = nn.Linear(64, 16)
        self.fc2 = nn.Linear(16, 16)
        self.fc3 = nn.Linear(16, 18)
        self.head = nn.Linear(18, 16)
        # 4 x 18, as the conv weight seen as a matrix, far from it; compressed at rank 1
        # ((4 + 18) * 1 * 2 < 72), not at rank 2 (min_compression_rate).
        self.side = nn.Linear(18, 4)

    def forward(self, x):
        h = torch.tanh(self.conv(x)).flatten(1)
        for fc in (self.fc1, self.fc2, self.fc3):
            h = torch.tanh(fc(h))
        # Two outputs, a wide one so that every layer below gets a full-rank gradient.
        return torch.cat([self.head(h), self.side(h)], dim=1)


def batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(PER_RANK, 2, 6, 6, generator=g), torch.randn(PER_RANK, 20, generator=g)


def torch_powerSGD_in_order(state, bucket):
    return in_order(lambda: torch_powersgd.powerSGD_hook(state, bucket))


def hooks(name, ours):
    if name == "allreduce":
        return None, compress.allreduce_hook if ours else torch_default.allreduce_hook
    if name == "fp16":
        return None, compress.fp16_compress_hook if ours else torch_default.fp16_compress_hook
    rank, ef, ws = POWERSGD[name]
    module = compress if ours else torch_powersgd
    state = module.PowerSGDState(None, matrix_approximation_rank=rank, start_powerSGD_iter=START,
                                 use_error_feedback=ef, warm_start=ws, random_seed=7)
    return state, compress.powerSGD_hook if ours else torch_powerSGD_in_order


# Who is compared with torch's hook on torch's DDP (the reference, "torch"): (DDP, our hook?).
VARIANTS = {"torch": (TorchDDP, False), "ours on torch DDP": (TorchDDP, True),
            "ours on our DDP": (DistributedDataParallel, True)}


def run_config(name, layout, rank):
    models, states, out = {}, {}, {}
    for who, (cls, ours) in VARIANTS.items():
        torch.manual_seed(0)
        ddp = cls(Model(), bucket_cap_mb=LAYOUTS[layout])
        states[who], hook = hooks(name, ours)
        ddp.register_comm_hook(states[who], hook)
        models[who], out[who] = (ddp, torch.optim.SGD(ddp.parameters(), lr=0.1)), []
    for step in range(STEPS):
        x, y = batch(step, rank)
        for who, (ddp, opt) in models.items():
            opt.zero_grad()
            F.mse_loss(ddp(x), y).backward()
            out[who].append([p.grad.clone() for p in ddp.parameters()])
            opt.step()
    if name in POWERSGD:
        for who, state in states.items():
            out[who + " state"] = {
                "iter": state.iter,
                "error": {k: v.clone() for k, v in state.error_dict.items()},
                "q": {k: v.clone() for k, v in state.q_memory_dict.items()},
                "stats": state.compression_stats(),
            }
    # torch quirk: no rank may leave while a peer's reducer is still finishing.
    dist.barrier()
    return out


def _worker(rank, world_size):
    torch.manual_seed(0)
    full_rank = []
    model = Model()
    x, y = batch(0, rank)
    F.mse_loss(model(x), y).backward()
    for p in model.parameters():
        if p.dim() >= 2:
            m = p.grad.reshape(p.shape[0], -1)
            full_rank.append(int(torch.linalg.matrix_rank(m)) == min(m.shape))
    results = {config: run_config(*config, rank) for config in CONFIGS}
    results["full rank"] = full_rank
    return results


@pytest.fixture(scope="module", params=[2, 3], ids=lambda p: f"world_size={p}")
def runs(request):
    """Every rank's results: one launch per world size runs every configuration."""
    return launch(_worker, request.param, backend="gloo", timeout=90)


def test_gradients_are_full_rank(runs):
    for result in runs:
        assert all(result["full rank"]), result["full rank"]


OTHERS = [v for v in VARIANTS if v != "torch"]
POWERSGD_CONFIGS = [c for c in CONFIGS if c[0] in POWERSGD]


def max_abs(xs, ys):
    return max((a - b).abs().max().item() for a, b in zip(xs, ys))


def config_id(config):
    return f"{config[0]}, {config[1]}"


# allreduce and fp16: equal bit for bit, the same arithmetic on the same buckets (both DDPs
# build torch's), so gloo adds the same numbers in the same order (at world size 3 too).
# PowerSGD: ours computes M Q and M^T P as (Q^T M^T)^T and (P^T M)^T (faster on a CPU), so the
# last bits of a sum may differ: equal within float32 rounding, step for step.
@pytest.mark.parametrize("who", OTHERS)
@pytest.mark.parametrize("config", CONFIGS, ids=config_id)
def test_every_hook_equals_torchs_step_for_step(runs, config, who):
    exact = config[0] not in POWERSGD
    for result in runs:
        for step, (ours, theirs) in enumerate(zip(result[config][who], result[config]["torch"])):
            if exact:
                assert max_abs(ours, theirs) == 0, (step, max_abs(ours, theirs))
            for a, b in zip(ours, theirs):
                assert_close(a, b, rtol=1e-5, atol=1e-6, msg=lambda m: f"step {step}: {m}")


def test_fp16_really_rounds(runs):
    # fp16 gradients are not the float32 ones: the tests above compared something.
    for layout in LAYOUTS:
        diffs = [max_abs(f, p) for f, p in zip(runs[0]["fp16", layout]["ours on our DDP"],
                                               runs[0]["allreduce", layout]["ours on our DDP"])]
        assert max(diffs) > 1e-6, diffs


@pytest.mark.parametrize("who", OTHERS)
@pytest.mark.parametrize("config", POWERSGD_CONFIGS, ids=config_id)
def test_powerSGD_state_matches(runs, config, who):
    # The memory is laid out like the buckets: the same in both DDPs.
    for result in runs:
        ours, theirs = result[config][who + " state"], result[config]["torch state"]
        assert ours["iter"] == theirs["iter"] == STEPS
        assert ours["stats"] == theirs["stats"]
        assert ours["error"].keys() == theirs["error"].keys()
        for k in ours["error"]:
            assert_close(ours["error"][k], theirs["error"][k], rtol=1e-5, atol=1e-6)
        assert ours["q"].keys() == theirs["q"].keys()
        for k in ours["q"]:
            assert_close(ours["q"][k], theirs["q"][k], rtol=1e-4, atol=1e-5)
        several = config[1] == "several buckets"
        assert (len(ours["q"]) > 1) == several or not POWERSGD[config[0]][2], ours["q"].keys()


@pytest.mark.parametrize("config", POWERSGD_CONFIGS, ids=config_id)
def test_powerSGD_compresses_only_from_start_iter(runs, config):
    # Every configuration trains the same weights on the same batches until START, so until
    # then its gradients are the plain all-reduce's ("allreduce"); at START they must not be.
    result = runs[0][config]["ours on our DDP"]
    plain = runs[0]["allreduce", config[1]]["ours on our DDP"]
    for step in range(START):
        assert max_abs(result[step], plain[step]) == 0, step
    assert max_abs(result[START], plain[START]) > 1e-4
    if POWERSGD[config[0]][1]:
        errors = runs[0][config]["ours on our DDP state"]["error"].values()
        assert any(e.abs().max() > 0 for e in errors)


def test_replicas_agree(runs):
    for config in CONFIGS:
        for step in range(STEPS):
            for r in runs[1:]:
                for a, b in zip(r[config]["ours on our DDP"][step],
                                runs[0][config]["ours on our DDP"][step]):
                    assert torch.equal(a, b), (config, step)


def test_orthogonalize_and_should_compress_match_torch():
    g = torch.Generator().manual_seed(0)
    for rank in (1, 2, 3, 5):
        for eps in (0, 1e-8):
            m = torch.randn(17, rank, generator=g)
            ours, theirs = m.clone(), m.clone().unsqueeze(0)
            compress.orthogonalize(ours, eps)
            torch_powersgd._orthogonalize(theirs, eps)
            assert_close(ours, theirs[0], rtol=0, atol=0)
            assert_close(ours.T @ ours, torch.eye(rank), rtol=1e-5, atol=1e-5)
    for n, m, r, rate in [(16, 16, 1, 2), (5, 16, 2, 2), (5, 16, 1, 2), (64, 1, 1, 2), (8, 8, 2, 1)]:
        assert compress.should_compress(n, m, r, rate) == torch_powersgd._should_compress(n, m, r, rate)


def test_values_sent_matches_torch_stats(runs):
    shapes = [p.shape for p in Model().parameters()]
    for (name, _) in POWERSGD_CONFIGS:
        rank = POWERSGD[name][0]
        _, before, after = runs[0][name, "several buckets"]["torch state"]["stats"]
        steps = STEPS - START
        assert sum(v for v, _ in compress.values_sent(shapes, "none")) * steps == before
        assert sum(v for v, _ in compress.values_sent(shapes, "powerSGD", rank)) * steps == after


def test_grad_bucket_outside_ddp():
    # One process (world size 1 over gloo would need a group): only the bookkeeping.
    grads = [torch.arange(6.0).view(2, 3), torch.tensor([7.0])]
    bucket = GradBucket.of(grads)
    assert torch.equal(bucket.buffer(), torch.tensor([0, 1, 2, 3, 4, 5, 7.0]))
    assert (bucket.index(), bucket.is_last(), bucket.parameters()) == (0, True, [])
    bucket.gradients()[0].mul_(2)  # views of the buffer, shaped like the gradients
    assert bucket.buffer()[:6].tolist() == [0, 2, 4, 6, 8, 10]
    assert grads[0].flatten().tolist() == [0, 1, 2, 3, 4, 5]  # a copy: the inputs stay
    # set_buffer replaces the buffer, as torch's (fp16_compress_wrapper): views follow it
    bucket.set_buffer(bucket.buffer().to(torch.float16))
    assert [(g.dtype, g.shape) for g in bucket.gradients()] == \
        [(torch.float16, (2, 3)), (torch.float16, (1,))]


def test_cost_model_with_compression():
    # Without compression a step is predict_step's (ring, no overlap) on the float32 bytes; on a
    # network of latency only, PowerSGD's three all-reduces cost three times plain's one.
    shapes = [p.shape for p in Model().parameters()]
    total = sum(v for v, _ in compress.values_sent(shapes, "none"))
    alpha, beta = link(1, 50)
    sent = compress.values_sent
    plain = predict_compressed_step(0.01, sent(shapes, "none"), 4, alpha, beta)
    assert plain == pytest.approx(predict_step(0.01, 4 * total, 4, "ring", alpha, beta)[0])
    latency = [predict_compressed_step(0.01, sent(shapes, scheme, rank=2), 4, alpha, 0) - 0.01
               for scheme in ("none", "powerSGD")]
    assert latency[1] == pytest.approx(3 * latency[0])
    big = [(2048, 2048)]  # 16 MiB as 16 KiB of P and Q: fewer bytes pay for two more latencies
    assert predict_compressed_step(0.01, sent(big, "powerSGD", 2), 4, alpha, beta) < \
        predict_compressed_step(0.01, sent(big, "none"), 4, alpha, beta)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="start_powerSGD_iter"):
        compress.PowerSGDState(None, start_powerSGD_iter=1)
    with pytest.raises(ValueError, match="matrix_approximation_rank"):
        compress.PowerSGDState(None, matrix_approximation_rank=0)
    compress.PowerSGDState(None, start_powerSGD_iter=0, use_error_feedback=False, warm_start=False)
    with pytest.raises(ValueError, match="scheme"):
        compress.values_sent([(3, 3)], "int8")


def test_the_2_node_link_benchmark():
    """The benchmark's link part (lesson 12 prints its committed rows), tiny: every row there,
    ratios that can be computed, bytes as counted, nothing left behind. Skips without root."""
    from dist_sgd.bench import compress as bench
    from dist_sgd.scale import netns
    from dist_sgd.scale.summaries import COMPRESS_LINK

    if problem := netns.privilege_problem():
        pytest.skip(f"no cluster here: {problem}")
    before = set(netns.ours())
    rows = {r["impl"]: r for r in bench.measure_link(quick=True)}
    assert list(rows) == list(bench.LINK_IMPLS)
    assert all(r["median_s"] > 0 and r["network"] == COMPRESS_LINK for r in rows.values())
    assert rows["our DDP + our PowerSGD rank 2"]["bytes_per_step"] == \
        rows["our DDP + our PowerSGD rank 2"]["bytes_on_paper"]
    assert set(netns.ours()) <= before  # its namespaces are gone (others' may run)
