"""Our DataParallel: one process, replicas in threads; its gradients are the full-batch ones.

No process group and no spawn: DataParallel is single-process by design, so these run fast.
Everything is float64, so the tolerances can stay tight.
"""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.testing import assert_close

from dist_sgd.data_parallel import DataParallel, gather, replicate, scatter
from dist_sgd.models import MLP, Net


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
    with pytest.raises(ValueError, match="batch size"):  # checked before any replica runs
        dp(torch.zeros(4, 784), torch.zeros(3, 2))
    with pytest.raises(RuntimeError, match="replica 0 failed"):
        dp(torch.zeros(4, 5))  # wrong feature size: raised in a thread, re-raised here


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
