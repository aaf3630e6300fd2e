"""Our DataParallel: one process, replicas in threads; its gradients are the full-batch ones.

No process group and no spawn: DataParallel is single-process by design, so these run fast.
Everything is float64, so the tolerances can stay tight.
"""
from collections import namedtuple

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.nn.parallel.scatter_gather as torch_sg
from torch.testing import assert_close

from dist_sgd.ddp.data_parallel import DataParallel, gather, replicate, scatter, scatter_kwargs
from dist_sgd.sgd.models import MLP, Net


class TwoHeads(nn.Module):
    """Tied weights, a frozen layer, a non-tensor argument and a tuple output."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(784, 16)
        self.frozen = nn.Linear(16, 16).requires_grad_(False)
        self.b = nn.Linear(16, 16)
        self.c = nn.Linear(16, 16)
        self.c.weight = self.b.weight
        self.register_buffer("shift", torch.full((16,), 0.1))

    def forward(self, x, scale):
        h = torch.tanh(self.frozen(torch.tanh(self.a(x.flatten(1))))) + self.shift
        return self.b(h) * scale, torch.tanh(self.c(h))


def grads_of(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def twin(cls, seed=0):
    torch.manual_seed(seed)
    return cls().double()


@pytest.mark.parametrize("replicas,batch", [(1, 5), (2, 8), (3, 10), (3, 2), (4, 7), (4, 5), (4, 6)])
def test_gradients_equal_full_batch(replicas, batch):
    torch.manual_seed(1)
    x = torch.randn(batch, 1, 28, 28, dtype=torch.float64)
    y = torch.randint(0, 10, (batch,))
    for cls in (MLP, Net):
        single, ours = twin(cls), twin(cls)
        single.eval(), ours.eval()  # Net's dropout would draw different masks
        dp = DataParallel(ours, device_ids=["cpu"] * replicas)
        out_single, out_ours = single(x), dp(x)
        assert_close(out_ours, out_single)
        F.nll_loss(out_single, y).backward()
        F.nll_loss(out_ours, y).backward()
        assert grads_of(ours).keys() == grads_of(single).keys()
        for n, g in grads_of(single).items():
            assert_close(grads_of(ours)[n], g, msg=lambda m: f"{cls.__name__} {n}: {m}")
        # One replica: nothing to split, the module is called as is (as torch does).
        phases = {"scatter", "replicate", "apply", "gather"} if replicas > 1 else set()
        assert set(dp.last_times) == phases


def test_training_steps_tied_frozen_tuple_output():
    single, ours = twin(TwoHeads), twin(TwoHeads)
    dp = DataParallel(ours, device_ids=["cpu", "cpu", "cpu"])
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (single, ours)]
    for step in range(3):
        x = torch.randn(9, 1, 28, 28, dtype=torch.float64)
        for model, opt in zip((single, dp), opts):
            opt.zero_grad()
            first, second = model(x, 0.5)  # a plain float goes to every replica
            (first.square().mean() + second.sum()).backward()
            opt.step()
        for (n, p), q in zip(single.named_parameters(), ours.parameters()):
            assert_close(q, p, msg=lambda m: f"step {step}: {n}: {m}")
    assert ours.frozen.weight.grad is None


def test_pieces():
    x = torch.arange(10.0).reshape(5, 2).requires_grad_()
    chunks = scatter((x, "tag"), [torch.device("cpu")] * 3)
    assert [c[0].shape[0] for c in chunks] == [2, 2, 1] and all(c[1] == "tag" for c in chunks)
    assert_close(gather([c[0] for c in chunks], "cpu"), x)
    model = MLP()
    (r1, r2) = replicate(model, ["cpu", "cpu"])
    assert r1 is not model and r1.fc1 is not model.fc1
    assert r1.fc1.weight is model.fc1.weight  # same device: the original, shared
    gather([c[0] for c in chunks], "cpu").sum().backward()
    assert_close(x.grad, torch.ones_like(x))  # the gradient reached the original input


Pair = namedtuple("Pair", "left right")


def _cpu_leaf_ops(monkeypatch):
    """torch's scatter/gather recursion (tuples, lists, dicts, namedtuples, None, kwargs
    padding) with its CUDA-only leaf copies swapped for the CPU equivalent (chunk / cat)."""
    class Scatter:
        @staticmethod
        def apply(devices, chunk_sizes, dim, t):
            return t.chunk(len(devices), dim)

    class Gather:
        @staticmethod
        def apply(device, dim, *ts):
            if dim == 0 and all(t.dim() == 0 for t in ts):
                ts = [t.view(1) for t in ts]
            return torch.cat(ts, dim)

    monkeypatch.setattr(torch_sg, "Scatter", Scatter)
    monkeypatch.setattr(torch_sg, "Gather", Gather)


def _same(a, b):
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert_close(a, b, rtol=0, atol=0)
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _same(a[k], b[k])
    else:
        assert a == b


@pytest.mark.parametrize("replicas,batch,dim", [(2, 6, 0), (3, 7, 0), (4, 5, 0), (3, 6, 1)])
def test_scatter_and_gather_follow_torch_rules(monkeypatch, replicas, batch, dim):
    _cpu_leaf_ops(monkeypatch)
    devices = [torch.device("cpu")] * replicas
    x = torch.randn(batch, batch, 3) if dim == 0 else torch.randn(2, batch, 3)
    inputs = (x, [x + 1, "tag"], {"a": x * 2, "b": None}, Pair(x - 1, 7), None)
    kwargs = {"mask": x > 0, "scale": 0.5, "nested": (x, [x])}
    for args, kws in ((inputs, kwargs), (inputs, {}), ((), kwargs), ((3, "no tensor"), {})):
        ours = scatter_kwargs(args, kws, devices, dim)
        theirs = torch_sg.scatter_kwargs(args, kws, devices, dim)
        _same(tuple(ours[0]), theirs[0])
        _same(tuple(ours[1]), theirs[1])
    outputs = [(Pair(torch.randn(2, 3), None), {"loss": torch.tensor(float(i)), "h": [torch.ones(1, 2)]})
               for i in range(replicas)]
    with pytest.warns(UserWarning, match="scalars"):
        ours = gather(outputs, "cpu", 0)
    theirs = torch_sg.gather(outputs, "cpu", 0)  # the warning is in the real (CUDA) Gather
    _same(ours, theirs)
    assert ours[1]["loss"].shape == (replicas,)  # one loss per replica, as torch returns


class Masked(nn.Module):
    """A keyword tensor (mask), a keyword float, and an optional None."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 4)

    def forward(self, x, mask=None, scale=1.0, extra=None):
        assert extra is None
        return self.fc(x) * mask * scale


def test_keyword_tensors_are_scattered():
    single, ours = twin(Masked), twin(Masked)
    x = torch.randn(7, 6, dtype=torch.float64)
    mask = (torch.rand(7, 4) > 0.3).double()
    dp = DataParallel(ours, device_ids=["cpu"] * 3)
    out_single, out_ours = single(x, mask=mask, scale=2.0), dp(x, mask=mask, scale=2.0)
    assert_close(out_ours, out_single)
    out_single.square().sum().backward()
    out_ours.square().sum().backward()
    for p, q in zip(single.parameters(), ours.parameters()):
        assert_close(q.grad, p.grad)


class WithLoss(nn.Module):
    """A module that returns its own loss: each replica gives a 0-d loss of its chunk."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 1)

    def forward(self, x, y):
        return (self.fc(x).squeeze(1) - y).square().mean()


def test_module_returning_its_loss_gives_one_loss_per_replica():
    model = twin(WithLoss)
    x, y = torch.randn(9, 6, dtype=torch.float64), torch.randn(9, dtype=torch.float64)
    with pytest.warns(UserWarning, match="scalars"):
        losses = DataParallel(model, device_ids=["cpu"] * 3)(x, y)
    assert_close(losses, torch.stack([model(x[i:i + 3], y[i:i + 3]) for i in (0, 3, 6)]))


def test_output_device_and_dim():
    class Columns(nn.Module):  # the batch along dim 1: (features, batch) -> (classes, batch)
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 3)

        def forward(self, x):
            return self.fc(x.t()).t()

    single, ours = twin(Columns), twin(Columns)
    x = torch.randn(6, 7, dtype=torch.float64)
    dp = DataParallel(ours, device_ids=["cpu"] * 3, output_device="cpu", dim=1)
    assert dp.output_device == torch.device("cpu")
    out = dp(x)
    assert out.shape == (3, 7)
    assert_close(out, single(x))
    out.square().sum().backward()
    single(x).square().sum().backward()
    for p, q in zip(single.parameters(), ours.parameters()):
        assert_close(q.grad, p.grad)


class WithNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 5)
        self.bn = nn.BatchNorm1d(5)

    def forward(self, x):
        return self.bn(self.fc(x))


def test_batchnorm_buffers_follow_replica_zero_without_races():
    # torch keeps the originals' buffers in replica 0 and gives the others copies that are
    # thrown away: the running statistics are those of the first chunk. Ours does the same,
    # so no two threads update one buffer; 20 runs give 20 identical results.
    x = torch.randn(12, 6, dtype=torch.float64)
    results = []
    for _ in range(20):
        model, alone = twin(WithNorm), twin(WithNorm)
        out = DataParallel(model, device_ids=["cpu"] * 4)(x)
        for i in range(4):  # in train mode each replica normalizes by its own chunk
            assert_close(out[3 * i:3 * i + 3], twin(WithNorm)(x[3 * i:3 * i + 3]))
        alone(x[:3])
        assert_close(model.bn.running_mean, alone.bn.running_mean)
        assert_close(model.bn.running_var, alone.bn.running_var)
        assert model.bn.num_batches_tracked.item() == 1
        results.append(model.bn.running_mean.clone())
    assert all(torch.equal(r, results[0]) for r in results)


def test_none_and_namedtuple_outputs():
    class Out(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 2)

        def forward(self, x):
            return Pair(self.fc(x), None), [self.fc(x).sum(1)]

    model = twin(Out)
    x = torch.randn(5, 6, dtype=torch.float64)
    (pair, rest) = DataParallel(model, device_ids=["cpu"] * 2)(x)
    assert isinstance(pair, Pair) and pair.right is None
    assert_close(pair.left, model.fc(x))
    assert isinstance(rest, list)
    assert_close(rest[0], model.fc(x).sum(1))


def test_no_gpu_means_plain_call():
    # torch.nn.DataParallel without GPUs calls the module directly; so does ours.
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: device_ids=None uses it")
    model = MLP().double()
    x = torch.randn(4, 1, 28, 28, dtype=torch.float64)
    ours, theirs = DataParallel(model), nn.DataParallel(model)
    assert ours.devices == [] and theirs.device_ids == []
    assert_close(ours(x), theirs(x))


def test_clear_errors():
    dp = DataParallel(MLP(), device_ids=["cpu", "cpu"])
    with pytest.raises(ValueError, match="empty batch"):
        dp(torch.zeros(0, 1, 28, 28))
    with pytest.raises(ValueError, match="same size"):  # checked before any replica runs
        dp(torch.zeros(4, 784), torch.zeros(3, 2))
    with pytest.raises(ValueError, match="same size"):  # a broadcastable keyword mask too
        dp(torch.zeros(4, 784), mask=torch.ones(1, 10))
    with pytest.raises(ValueError, match="dim 0"):
        dp(torch.tensor(1.0))
    with pytest.raises(RuntimeError, match="replica 0 failed"):
        dp(torch.zeros(4, 5))  # wrong feature size: raised in a thread, re-raised here
    with pytest.raises(TypeError, match="cannot gather"):
        gather([1.5, 2.5], "cpu")


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="needs 2 GPUs to compare with torch.nn.DataParallel's real work")
def test_against_torch_on_gpus():
    torch.manual_seed(0)
    ours_model, theirs_model = twin(MLP).cuda(), twin(MLP).cuda()
    x = torch.randn(16, 1, 28, 28, dtype=torch.float64, device="cuda")
    y = torch.randint(0, 10, (16,), device="cuda")
    F.nll_loss(DataParallel(ours_model)(x), y).backward()
    F.nll_loss(nn.DataParallel(theirs_model)(x), y).backward()
    for p, q in zip(ours_model.parameters(), theirs_model.parameters()):
        assert_close(p.grad, q.grad)
