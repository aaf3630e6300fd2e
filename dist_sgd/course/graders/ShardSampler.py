"""Lesson 05's ShardSampler: index for index torch's DistributedSampler, on every rank, for
dataset lengths that divide by the world size and not (smaller than it too), shuffled or
not, with drop_last or padding, several seeds, epochs 0 and 1 through set_epoch."""
import torch
from torch.utils.data.distributed import DistributedSampler

from dist_sgd.course.grade import Grader

grader = Grader("ShardSampler", error_hints={
    "non-iterator": "__iter__ must return an iterator: return iter(the list of indices)",
    "'float' object cannot be interpreted as an integer":
        "num_samples must be an int: math.ceil(n / num_replicas) or n // num_replicas",
    "has no attribute 'num_samples'": "__init__ sets self.num_samples, which __len__ returns"})
HINTS = {
    "seed": "every rank must draw the same permutation: seed the generator with seed + epoch "
            "only, never with the rank",
    "epoch": "set_epoch(epoch) must change the order: seed the generator with self.seed + "
             "self.epoch",
    "strided": "rank r takes every num_replicas-th index from position r "
               "(order[r::num_replicas]), not a block of consecutive ones",
    "pad": "without drop_last pad the order up to num_samples * num_replicas with its first "
           "indices, wrapping around when n < num_replicas, so every rank gets as many",
    "cut": "with drop_last every rank gets n // num_replicas indices: cut the order's tail",
}


class Items:
    """A dataset of n items: a sampler only looks at its length."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


def _indices(ctx, n, epoch=0, **options):
    """(ours, torch's, our len()) for this rank: the indices of one epoch after set_epoch."""
    sampler = ctx.call(ctx.impl.ShardSampler, Items(n), num_replicas=ctx.world_size,
                       rank=ctx.rank, **options)
    ctx.call(sampler.set_epoch, epoch)
    got = [int(i) for i in ctx.call(iter, sampler)]
    torchs = DistributedSampler(Items(n), num_replicas=ctx.world_size, rank=ctx.rank, **options)
    torchs.set_epoch(epoch)
    return got, list(torchs), ctx.call(len, sampler)


def _blocks(ctx, n, epoch, options):
    """This rank's indices had it taken a block of torch's order, not every p-th index."""
    p = ctx.world_size
    ranks = []
    for r in range(p):
        theirs = DistributedSampler(Items(n), num_replicas=p, rank=r, **options)
        theirs.set_epoch(epoch)
        ranks.append(list(theirs))
    order = [ranks[j % p][j // p] for j in range(len(ranks[0]) * p)]
    k = len(ranks[ctx.rank])
    return order[ctx.rank * k:(ctx.rank + 1) * k]


def _fitting(ctx, hints, got, expected, n, epoch, options):
    """The hints the evidence supports: "strided" when this rank took a block of the order,
    "seed" when it took other indices than torch's, and not as a block."""
    blocks = ctx.world_size > 1 and got == _blocks(ctx, n, epoch, options)
    keep = []
    for hint in hints:
        if hint == HINTS["strided"] and not blocks:
            continue
        if hint == HINTS["seed"] and (blocks or sorted(got) == sorted(expected)):
            continue
        keep.append(hint)
    return keep


def _compare(ctx, cases, hints):
    """cases: [(n, epoch, options)]: every one's indices and length equal torch's."""
    every = hints
    for n, epoch, options in cases:
        got, expected, length = _indices(ctx, n, epoch, **options)
        hints = _fitting(ctx, every, got, expected, n, epoch, options)
        what = f"n = {n}, epoch {epoch}, " + ", ".join(f"{k}={v}" for k, v in options.items())
        ctx.expect(len(got) == len(expected), f"{what}: {len(got)} indices on this rank, "
                   f"expected {len(expected)}", hints)
        wrong = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), None)
        if wrong is not None:
            start = max(0, wrong - 3)
            near = slice(start, start + 7)
            ctx.fail(f"{what}: this rank's index at position {wrong} is {got[wrong]}, expected "
                     f"{expected[wrong]} (from position {start}: {got[near]}, expected "
                     f"{expected[near]})", hints)
        ctx.expect(length == len(expected), f"{what}: len(sampler) is {length}, expected "
                   f"{len(expected)} (what one epoch yields)", hints)


@grader.case("shuffle=False, n = 12 and 10: the strided split")
def in_order(ctx):
    """Without shuffling, this rank's indices and len() equal DistributedSampler's: every
    num_replicas-th index from position rank."""
    _compare(ctx, [(n, 0, {"shuffle": False}) for n in (12, 10)], [HINTS["strided"]])


@grader.case("shuffled, seeds 0 and 7, n = 100 and 101, epoch 0")
def shuffled(ctx):
    """Shuffled, index for index DistributedSampler's for two seeds and two lengths: every rank
    draws the same permutation and takes its stride, from a generator of its own (torch's
    global one left as it was)."""
    before = torch.get_rng_state()
    _compare(ctx, [(n, 0, {"seed": seed}) for seed in (0, 7) for n in (100, 101)],
             [HINTS["seed"], HINTS["strided"]])
    ctx.expect(torch.equal(torch.get_rng_state(), before), "drawing the order changed torch's "
               "global random generator (DistributedSampler leaves it alone)",
               ["draw from a generator of your own, g = torch.Generator(); g.manual_seed(...): "
                "torch.manual_seed would reseed the model's dropout and initialisation too"])


@grader.case("set_epoch(1): a new order, every rank the same one")
def next_epoch(ctx):
    """Set_epoch(1) gives DistributedSampler's epoch-1 order, the same permutation on every
    rank."""
    _compare(ctx, [(101, epoch, {"seed": 3}) for epoch in (0, 1)], [HINTS["epoch"]])


@grader.case("padding: n = 11 and n smaller than the world size")
def padding(ctx):
    """Without drop_last, DistributedSampler's padding: the order wrapped around to equal
    lengths, also when n is smaller than the world size (1 item on 3 or 4 ranks: more padding
    than items, the order repeated as often as needed)."""
    small = sorted({max(1, ctx.world_size - 1), 1})  # 1 item on 3 ranks: pad more than n
    _compare(ctx, [(n, 0, {"shuffle": shuffle}) for n in (11, *small)
                   for shuffle in (False, True)],
             [HINTS["pad"]])


@grader.case("drop_last=True: n = 11, 12 and smaller than the world size")
def drop_last(ctx):
    """With drop_last, DistributedSampler's cut: n // num_replicas indices per rank."""
    cases = [(n, 0, {"drop_last": True, "shuffle": shuffle}) for n in (11, 12, ctx.world_size - 1)
             for shuffle in (False, True) if n > 0]
    _compare(ctx, cases, [HINTS["cut"]])


@grader.case("the ranks' shards cover the dataset once, plus the padding only")
def cover(ctx):
    """Together the ranks' shards hold every index once, plus the padding only (or minus the
    cut tail), with equal lengths on every rank."""
    n, shards = 13, []
    for drop in (False, True):
        got, _, _ = _indices(ctx, n, 1, seed=5, drop_last=drop)
        shards.append(ctx.everyone(got))
    for drop, ranks in zip((False, True), shards):
        every = [i for shard in ranks for i in shard]
        lengths = sorted({len(shard) for shard in ranks})
        ctx.expect(len(lengths) == 1, f"drop_last={drop}: the ranks get {lengths} indices "
                   f"(every rank must run as many steps)", [HINTS["pad"]])
        ctx.expect(all(0 <= i < n for i in every), f"drop_last={drop}: an index out of range",
                   [])
        missing = (n - len(every)) if drop else len(set(range(n)) - set(every))
        ctx.expect(missing <= (n % ctx.world_size if drop else 0),
                   f"drop_last={drop}: {missing} of the {n} items on no rank",
                   [HINTS["seed"], HINTS["strided"]])
        twice = len(every) - len(set(every))
        ctx.expect(twice == (0 if drop else len(every) - n),
                   f"drop_last={drop}: {twice} indices on two ranks (or twice on one)",
                   [HINTS["seed"], HINTS["pad"]])
