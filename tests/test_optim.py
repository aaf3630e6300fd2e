"""dist_sgd.sgd.optim.SGD against torch.optim.SGD, step for step, for every option."""
import copy
import itertools

import pytest
import torch
import torch.nn as nn

from dist_sgd.sgd.optim import SGD

STEPS = 25


def make_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3)).double()


def batch(g):
    return (torch.randn(8, 5, generator=g, dtype=torch.float64),
            torch.randn(8, 3, generator=g, dtype=torch.float64))


def run(opt_cls, model, steps=STEPS, groups=None, skip_every=0, **options):
    """Train `model` with opt_cls for `steps` steps on fixed random data; return the optimizer."""
    params = groups(model) if groups else model.parameters()
    opt = opt_cls(params, **options)
    g = torch.Generator().manual_seed(1)
    for step in range(steps):
        x, y = batch(g)
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        if skip_every and step % skip_every == 1:
            model[2].bias.grad = None  # a parameter without a gradient this step
        opt.step()
    return opt


def assert_same(a, b):
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        # The same operations in the same order: bit for bit, not just close.
        torch.testing.assert_close(p, q, rtol=0, atol=0)


OPTIONS = [dict(lr=0.1)]
for momentum, dampening, weight_decay, nesterov in itertools.product(
        (0.0, 0.9), (0.0, 0.3), (0.0, 0.01), (False, True)):
    if nesterov and (momentum == 0 or dampening != 0):
        continue
    OPTIONS.append(dict(lr=0.05, momentum=momentum, dampening=dampening,
                        weight_decay=weight_decay, nesterov=nesterov))


@pytest.mark.parametrize("options", OPTIONS,
                         ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_sgd_matches_torch(options):
    ours, theirs = make_model(), make_model()
    run(SGD, ours, skip_every=4, **options)
    run(torch.optim.SGD, theirs, skip_every=4, **options)
    assert_same(ours, theirs)
    assert any(p.abs().sum() > 0 for p in ours.parameters())


def test_parameter_groups_match_torch():
    def groups(model):
        return [{"params": model[0].parameters()},
                {"params": model[2].parameters(), "lr": 0.2, "momentum": 0.5, "nesterov": True}]

    ours, theirs = make_model(), make_model()
    opt = run(SGD, ours, groups=groups, lr=0.05, momentum=0.9, weight_decay=0.01)
    run(torch.optim.SGD, theirs, groups=groups, lr=0.05, momentum=0.9, weight_decay=0.01)
    assert_same(ours, theirs)
    assert [g["lr"] for g in opt.param_groups] == [0.05, 0.2]


def test_state_dict_round_trip_and_torch_layout():
    options = dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01)
    straight = make_model()
    run(SGD, straight, steps=2 * STEPS, **options)

    # Stop halfway, save, rebuild both model and optimizer from the saved state, go on.
    first = make_model()
    opt = run(SGD, first, steps=STEPS, **options)
    saved_model, saved_opt = copy.deepcopy(first.state_dict()), copy.deepcopy(opt.state_dict())
    resumed = make_model(seed=99)
    resumed.load_state_dict(saved_model)
    opt2 = SGD(resumed.parameters(), lr=1.0)  # wrong lr on purpose: the state dict restores it
    opt2.load_state_dict(saved_opt)
    assert opt2.param_groups[0]["lr"] == 0.05
    g = torch.Generator().manual_seed(1)
    for _ in range(STEPS):  # skip the data the first half consumed
        batch(g)
    for _ in range(STEPS):
        x, y = batch(g)
        opt2.zero_grad()
        ((resumed(x) - y) ** 2).mean().backward()
        opt2.step()
    assert_same(resumed, straight)

    # Same layout as torch's: a torch optimizer's state loads into ours and vice versa.
    theirs_model = make_model()
    theirs = run(torch.optim.SGD, theirs_model, steps=STEPS, **options)
    ours_state, theirs_state = opt.state_dict()["state"], theirs.state_dict()["state"]
    assert ours_state.keys() == theirs_state.keys()
    for k in ours_state:
        torch.testing.assert_close(ours_state[k]["momentum_buffer"],
                                   theirs_state[k]["momentum_buffer"], rtol=0, atol=0)
    back = torch.optim.SGD(make_model().parameters(), lr=1.0)
    back.load_state_dict(opt.state_dict())
    assert back.param_groups[0]["momentum"] == 0.9


def test_zero_grad_sets_to_none_like_torch():
    model = make_model()
    opt = SGD(model.parameters(), lr=0.1)
    model(torch.randn(2, 5, dtype=torch.float64)).sum().backward()
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())
    model(torch.randn(2, 5, dtype=torch.float64)).sum().backward()
    opt.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())


def test_closure_and_first_step_momentum_buffer():
    model = make_model()
    opt = SGD(model.parameters(), lr=0.1, momentum=0.9, dampening=0.5)
    x = torch.randn(4, 5, dtype=torch.float64)

    def closure():
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        return loss

    loss = opt.step(closure)
    assert loss.item() > 0
    for p in model.parameters():  # first step: buffer = gradient, no dampening applied yet
        torch.testing.assert_close(opt.state[p]["momentum_buffer"], p.grad, rtol=0, atol=0)


@pytest.mark.parametrize("kwargs, message", [
    (dict(lr=-0.1), "Invalid learning rate"),
    (dict(lr=0.1, momentum=-1), "Invalid momentum"),
    (dict(lr=0.1, weight_decay=-1), "Invalid weight_decay"),
    (dict(lr=0.1, nesterov=True), "Nesterov momentum requires"),
    (dict(lr=0.1, momentum=0.9, dampening=0.1, nesterov=True), "Nesterov momentum requires"),
])
def test_invalid_arguments_like_torch(kwargs, message):
    for cls in (SGD, torch.optim.SGD):
        with pytest.raises(ValueError, match=message):
            cls(make_model().parameters(), **kwargs)


def test_invalid_group_option_is_caught():
    model = make_model()
    with pytest.raises(ValueError, match="Nesterov"):
        SGD([{"params": model[0].parameters()},
             {"params": model[2].parameters(), "nesterov": True}], lr=0.1)


@pytest.mark.parametrize("options", [
    dict(maximize=True), dict(maximize=True, momentum=0.9, weight_decay=0.01),
    dict(foreach=True, momentum=0.9, nesterov=True), dict(foreach=False, momentum=0.9),
    dict(lr=torch.tensor(0.05), momentum=0.9), dict(lr=torch.tensor(0.05), maximize=True),
], ids=["maximize", "maximize-momentum-wd", "foreach", "no-foreach", "tensor-lr", "tensor-lr-max"])
def test_keyword_options_match_torch(options):
    ours, theirs = make_model(), make_model()
    run(SGD, ours, skip_every=4, **options)
    run(torch.optim.SGD, theirs, skip_every=4, **options)
    assert_same(ours, theirs)


def test_defaults_and_state_dict_keys_match_torch():
    ours = SGD(make_model().parameters())
    theirs = torch.optim.SGD(make_model().parameters())
    assert ours.defaults == theirs.defaults  # lr=1e-3 and every keyword, as torch
    assert ours.state_dict()["param_groups"][0].keys() == theirs.state_dict()["param_groups"][0].keys()


@pytest.mark.parametrize("option", ["fused", "differentiable"])
def test_unimplemented_options_refused_clearly(option):
    with pytest.raises(ValueError, match=f"does not implement {option}=True"):
        SGD(make_model().parameters(), lr=0.1, **{option: True})
    # ... also when they arrive in a torch state_dict: refused, not silently ignored
    theirs = torch.optim.SGD(make_model().parameters(), lr=0.1, **{option: True})
    ours = SGD(make_model().parameters(), lr=0.1)
    with pytest.raises(ValueError, match=f"does not implement {option}=True"):
        ours.load_state_dict(theirs.state_dict())


def test_tensor_lr_must_have_one_element():
    for cls in (SGD, torch.optim.SGD):
        with pytest.raises(ValueError, match="1-element"):
            cls(make_model().parameters(), lr=torch.tensor([0.1, 0.2]))
