"""Gradient equivalence: the distributed average equals the single-process full-batch gradient.

A spawn costs seconds, so one group per world size (1, 2, 3) runs every case inside the
ranks (dist_sgd.plumbing.cases). Each case proves several properties (Checks: property ->
None when it held, else the message of the first assertion that failed on that rank), and
sits right above the tests that read them, one property each. float64 throughout, so "equal"
can mean ~1e-15; the single process trains with torch.optim.SGD, the ranks with ours.

What the course's average_gradients grader proves (one step of Awkward: every gradient, the
frozen and unused ones left None; three steps: the weights of one process, the same on every
rank; the tied weight reduced once, the buffer left alone) is not proved twice: the test runs
the grader's own cases here, on every way of calling average_gradients.
"""
import copy
import functools
import types

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset
from torch.utils.data.distributed import DistributedSampler

from dist_sgd.comm import collectives
from dist_sgd.course import grade
from dist_sgd.plumbing.cases import Cases, Checks
from dist_sgd.sgd.data import synthetic
from dist_sgd.sgd.models import MLP, Awkward
from dist_sgd.sgd.optim import SGD
from dist_sgd.sgd.partition import ShardSampler
from dist_sgd.sgd.sync import average_gradients, broadcast_parameters, gradients_to_sync
from dist_sgd.sgd.train import evaluate, max_diff_across_ranks, per_rank_batch, shard_loader

PER_RANK = 4  # items per rank per step
STEPS = 3
WAYS = {"torch, per parameter": (None, False), "torch, flat": (None, True),
        "ours, per parameter": (collectives.all_reduce, False),
        "ours, flat": (collectives.all_reduce, True)}
BROADCASTS = {"torch": None, "ours": collectives.broadcast}


# ---- one spawned group per world size runs every case below --------------------------------

CASES = Cases()  # each case: fn(rank, world_size) -> Checks


@pytest.fixture(params=[1, 2, 3], ids=lambda ws: f"ws{ws}")
def world_size(request):
    return request.param


def held(world_size, case, prop):
    CASES.held(world_size, case, part=prop)


def grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def data_for(world_size):
    images, labels = synthetic(STEPS * world_size * PER_RANK * 2, seed=1).tensors
    x = images.double().reshape(STEPS * 2, world_size * PER_RANK, 1, 28, 28)
    return x, labels.reshape(STEPS * 2, world_size * PER_RANK)



# ---- average_gradients: every way against one process on the global batch ----------------

AVERAGE = grade.grader_of("average_gradients")


@CASES.case()
def grader_every_way(rank, world_size):
    """The course's average_gradients grader, each case, on each way of calling ours."""
    props = Checks(rank)
    for way, (all_reduce, flat) in WAYS.items():
        piece = functools.partial(average_gradients, flat=flat, all_reduce=all_reduce)
        impl = types.SimpleNamespace(average_gradients=piece)
        for title in AVERAGE.cases:
            with props.check(f"{title} / {way}"):
                failure = grade.run_case(AVERAGE, title, rank, world_size, impl)
                assert failure is None, "\n".join([failure[0]] + list(failure[1]))
    return props


@pytest.mark.parametrize("title", list(AVERAGE.cases))
@pytest.mark.parametrize("way", WAYS)
def test_the_average_gradients_grader_passes_every_way(world_size, way, title):
    held(world_size, grader_every_way, f"{title} / {way}")


@CASES.case()
def with_our_sgd(rank, world_size):
    """STEPS steps of Awkward: this rank's share + average_gradients + our SGD (momentum,
    weight decay), against one process on each whole global batch with torch.optim.SGD; and
    the number of all-reduce calls average_gradients says it made; the ranks' weights equal
    bit for bit."""
    props = Checks(rank)
    x, y = data_for(world_size)
    for way, (all_reduce, flat) in WAYS.items():
        torch.manual_seed(0)  # the same initial weights on every rank
        ref = Awkward(784, 10).double()
        model = copy.deepcopy(ref)
        options = {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-3}
        opt_ref = torch.optim.SGD(ref.parameters(), **options)
        opt = SGD(model.parameters(), **options)
        for step in range(STEPS):
            xs, ys = x[step], y[step]  # this step's global batch
            opt_ref.zero_grad()
            F.nll_loss(ref(xs), ys).backward()  # single process: mean over the global batch
            opt.zero_grad()
            mine = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
            F.nll_loss(model(xs[mine]), ys[mine]).backward()  # mean over the local batch
            calls = average_gradients(model, flat=flat, all_reduce=all_reduce)
            with props.check(f"calls {way}"):  # 11 parameters: 1 frozen, 2 never get a gradient
                assert calls == (1 if flat else 8), f"{calls} all-reduce calls"
            opt_ref.step()
            opt.step()
        with props.check(f"weights {way}"):
            for (name, p), q in zip(model.named_parameters(), ref.parameters()):
                torch.testing.assert_close(p, q, msg=f"weight {name} after {STEPS} steps")
        with props.check(f"identical {way}"):
            assert max_diff_across_ranks(model) == 0.0, "ranks hold different weights"
    return props


@pytest.mark.parametrize("way", WAYS)
def test_weights_after_steps_with_our_sgd_equal_single_process_torch_sgd(world_size, way):
    held(world_size, with_our_sgd, f"weights {way}")


@pytest.mark.parametrize("way", WAYS)
def test_ranks_hold_bitwise_identical_weights_with_our_sgd(world_size, way):
    held(world_size, with_our_sgd, f"identical {way}")


@pytest.mark.parametrize("way", WAYS)
def test_one_all_reduce_when_flat_one_per_gradient_otherwise(world_size, way):
    held(world_size, with_our_sgd, f"calls {way}")


@CASES.case()
def case_tied_in_a_list(rank, world_size):
    props = Checks(rank)
    x, y = data_for(world_size)
    # A list with the tied weight twice still reduces it once (else it would be halved again).
    model = Awkward(784, 10).double()
    F.nll_loss(model(x[0, :PER_RANK]), y[0, :PER_RANK]).backward()
    with props.check("tied in a list"):
        found = gradients_to_sync(list(model.parameters()) + [model.a.weight])
        assert len(found) == 8, f"{len(found)} gradients to sync, not 8"
    return props


def test_a_tied_weight_listed_twice_is_reduced_once(world_size):
    held(world_size, case_tied_in_a_list, "tied in a list")


@CASES.case()
def case_accumulation(rank, world_size, k=2):
    """k micro-batches per rank, loss / k each, one average: the same as one big batch."""
    props = Checks(rank)
    x, y = data_for(world_size)
    torch.manual_seed(1)
    ref, model = MLP(hidden=8).double(), MLP(hidden=8).double()
    model.load_state_dict(ref.state_dict())
    xs, ys = x.reshape(-1, *x.shape[2:]), y.reshape(-1)  # k * global batch items
    big = k * world_size * PER_RANK
    xs, ys = xs[:big], ys[:big]
    F.nll_loss(ref(xs), ys).backward()
    local = slice(rank * k * PER_RANK, (rank + 1) * k * PER_RANK)
    for xm, ym in zip(xs[local].chunk(k), ys[local].chunk(k)):
        (F.nll_loss(model(xm), ym) / k).backward()  # .grad accumulates across backward calls
    average_gradients(model)
    with props.check("accumulation"):
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad)
    return props


def test_accumulated_micro_batches_equal_one_big_batch(world_size):
    held(world_size, case_accumulation, "accumulation")


# ---- lesson 06's loop, broadcast_parameters, the sampler ----------------------------------

@CASES.case()
def case_train_loop(rank, world_size):
    """shard_loader's per-rank batches + average_gradients == single-process SGD on the same
    global batches; every item once; evaluate == one process."""
    props = Checks(rank)
    images, labels = synthetic(48, seed=3).tensors
    dataset = TensorDataset(images.double(), labels)
    global_batch = 2 * world_size * 3  # per rank 6
    torch.manual_seed(2)
    model = MLP(hidden=8).double()
    ref = copy.deepcopy(model)
    loader = shard_loader(dataset, global_batch, seed=5)
    loader.sampler.set_epoch(1)
    opt = SGD(model.parameters(), lr=0.2, momentum=0.5)
    seen = 0
    for xb, yb in loader:  # lesson 06's step
        seen += len(yb)
        opt.zero_grad()
        F.nll_loss(model(xb), yb).backward()
        average_gradients(model)
        opt.step()
    order = ShardSampler(dataset, 1, 0, seed=5)  # the single process sees the same order
    order.set_epoch(1)
    opt = torch.optim.SGD(ref.parameters(), lr=0.2, momentum=0.5)
    indices = list(order)
    for start in range(0, len(indices), global_batch):
        xb, yb = dataset[torch.tensor(indices[start:start + global_batch])]
        opt.zero_grad()
        F.nll_loss(ref(xb), yb).backward()
        opt.step()
    with props.check("train loop"):
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p, q)
    with props.check("every item once"):
        assert seen * world_size == 48, f"{seen} items on each of {world_size} ranks, not 48 in all"
    # evaluate shares the test set out without padding: the same numbers as one process
    result = evaluate(model, dataset, batch_size=7)
    with torch.no_grad():
        out = model(dataset.tensors[0])
    with props.check("evaluate"):
        torch.testing.assert_close(result["loss"], F.nll_loss(out, labels).item())
        assert result["correct"] == (out.argmax(1) == labels).sum().item(), result
        assert result["total"] == 48, result
    return props


def test_shard_loader_training_equals_single_process(world_size):
    held(world_size, case_train_loop, "train loop")


def test_shard_loader_gives_every_item_once(world_size):
    held(world_size, case_train_loop, "every item once")


def test_evaluate_equals_one_process(world_size):
    held(world_size, case_train_loop, "evaluate")


@CASES.case()
def case_broadcast(rank, world_size):
    """broadcast_parameters: ranks start different, end equal to rank 0 (buffers too)."""
    props = Checks(rank)
    for name, broadcast in BROADCASTS.items():
        torch.manual_seed(100 + rank)
        model = Awkward(784, 10)
        model.running.fill_(rank + 1.0)
        before = max_diff_across_ranks(model)
        sent = broadcast_parameters(model, src=0, broadcast=broadcast)
        after = max_diff_across_ranks(model)
        with props.check(f"broadcast {name}"):
            assert sent == 12, f"{sent} tensors sent, not 11 parameters + 1 buffer"
            assert (before > 0) == (world_size > 1), before  # one rank: nothing differs at first
            assert after == 0.0, f"ranks differ by {after} after broadcast_parameters"
            assert model.running.eq(1.0).all(), "the buffer is not rank 0's"
    return props


@pytest.mark.parametrize("broadcast", BROADCASTS)
def test_broadcast_parameters_copies_rank_0s_parameters_and_buffers(world_size, broadcast):
    held(world_size, case_broadcast, f"broadcast {broadcast}")


@CASES.case()
def case_sampler(rank, world_size):
    props = Checks(rank)
    data = synthetic(3 * world_size * PER_RANK * 2, seed=1)
    sampler, theirs = ShardSampler(data), DistributedSampler(data)
    with props.check("sampler"):  # world size and rank from the group, like DistributedSampler
        assert (sampler.num_replicas, sampler.rank) == (world_size, rank)
        assert list(sampler) == list(theirs)
    return props


def test_shard_sampler_takes_its_rank_from_the_group(world_size):
    held(world_size, case_sampler, "sampler")


# ---- outside a group ----------------------------------------------------------------------

def test_average_gradients_outside_a_group_says_what_it_needs():
    with pytest.raises(RuntimeError, match="needs a process group"):
        average_gradients(MLP())


def test_per_rank_batch_refuses_what_does_not_divide_and_floats():
    with pytest.raises(ValueError, match="does not divide evenly over 3 ranks"):
        per_rank_batch(64, 3)
    with pytest.raises(ValueError, match="positive integer"):
        per_rank_batch(64.0, 2)
    assert per_rank_batch(64, 4) == 16
