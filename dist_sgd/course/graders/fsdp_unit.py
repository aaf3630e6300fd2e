"""Lesson 16's FSDP unit (dist_sgd.shard.fsdp_unit._Unit): gather, free and reduce-scatter of one
unit's flat pieces, each against torch's own collectives on the same tensors. The unit is a
Linear(7, 13): a weight of 91 and a bias of 13 elements, so at p = 2 and 3 the last pieces
are padded."""
import time

import torch
import torch.distributed as dist
import torch.nn as nn

from dist_sgd.comm.counted import Counted
from dist_sgd.course.grade import Grader
from dist_sgd.shard.fsdp_unit import _Memory, _Shard

PAD_HINT = "every piece an all-gather fills, and every piece a reduce-scatter sends, has " \
           "s.size elements: pad to s.size * p"
RESIZE_HINT = "resize the storages, never replace them"
grader = Grader("fsdp_unit", error_hints={
    "split_with_sizes expects split_sizes to sum exactly": "pad each gradient with zeros to "
    "s.size * p elements before cutting it into p pieces of s.size",
    "Tensor list input to scatter/gather must match": PAD_HINT,
    "Check failed: outputs[0].sizes()": PAD_HINT,  # gloo's reduce-scatter, pieces of two sizes
    "different dtypes": "cast your piece to self.dtypes[i] before gathering it: the storage "
    "holds the compute dtype",
    "NoneType": "under sync=True every shard that requires grad gets a reduce-scatter"})
LATE = 0.2  # seconds rank 0 waits before it gathers: its peers' gathers are still in flight


def _unit(ctx, compute_dtype=None, comm=None):
    """A unit over a Linear(7, 13) (the same on every rank), its shards and its memory."""
    torch.manual_seed(0)
    layer = nn.Linear(7, 13)
    full = [layer.weight.detach().clone(), layer.bias.detach().clone()]
    shards = [_Shard(p, ctx.rank, ctx.world_size) for p in (layer.weight, layer.bias)]
    memory, comm = _Memory(), comm or Counted("torch")
    unit = ctx.call(ctx.impl._Unit, "layer", layer, [(layer, "weight", 0), (layer, "bias", 1)],
                    shards, compute_dtype, comm, memory, ctx.world_size)
    return unit, shards, full, memory, comm


def _my_piece(ctx, full, s):
    """This rank's piece of a full tensor, padded with zeros as the shard is."""
    padded = torch.zeros(s.size * ctx.world_size, dtype=full.dtype)
    padded[:s.numel] = full.reshape(-1)
    return padded[ctx.rank * s.size:(ctx.rank + 1) * s.size]


def _gradients(ctx, seed):
    """Different gradients on every rank, and their mean over the ranks by torch."""
    g = torch.Generator().manual_seed(seed + ctx.rank)
    grads = [torch.randn(13, 7, generator=g), torch.randn(13, generator=g)]
    means = [t.clone() for t in grads]
    for t in means:
        dist.all_reduce(t)
        t /= ctx.world_size
    return grads, means


@grader.case("gather: the full weight and bias from every rank's piece")
def gather(ctx):
    """After gather() and wait(), the unit's storages hold the full weight and bias, bit for
    bit, the state is "gathered" and self.memory counts self.nbytes."""
    unit, shards, full, memory, _ = _unit(ctx)
    ctx.call(unit.gather)
    ctx.call(unit.wait)
    got = [unit.tensor(i, s.shape).clone() for i, s in enumerate(shards)]
    state, live = unit.state, memory.live
    for name, g, f in zip(("weight", "bias"), got, full):
        ctx.expect_close(g, f, f"the gathered {name}", atol=0, hints=[
            "all-gather into self.tensor(i, (self.numels[i],)).split(s.size): views of the "
            "storage, so the gathered values land in it"])
    ctx.expect(state == "gathered", f"state is {state!r} after gather() and wait()",
               ["gather() sets self.state = \"gathering\"; wait() then makes it \"gathered\""])
    ctx.expect(live == unit.nbytes, f"self.memory counts {live} bytes while gathered, expected "
               f"{unit.nbytes} (self.nbytes)", ["self.memory.count(self.nbytes) in gather()"])


@grader.case("gather in float16: the pieces cast before they are sent")
def gather_half(ctx):
    """With a float16 compute dtype, each piece is cast before it is sent and the gathered
    parameters are the float16 full ones."""
    unit, shards, full, _, comm = _unit(ctx, torch.float16)
    ctx.call(unit.gather)
    ctx.call(unit.wait)
    got = [unit.tensor(i, s.shape).clone() for i, s in enumerate(shards)]
    sent = [n for name, n in comm.log if name == "all_gather"]
    for name, g, f in zip(("weight", "bias"), got, full):
        ctx.expect_close(g, f.half(), f"the gathered {name} (float16)", atol=0)
    want = [s.size * ctx.world_size * 2 for s in shards]
    ctx.expect(sent == want, f"all-gathered {sent} bytes, expected {want} (2 bytes a number)",
               ["cast the piece to self.dtypes[i] before the all-gather: half the bytes"])


@grader.case("free: 0 bytes held; a tensor made before comes back with the next gather")
def free(ctx):
    """Free() gives every storage's bytes back (0 bytes, state "free", memory counted down),
    and a tensor made on a storage before comes back with the next gather."""
    unit, shards, full, memory, _ = _unit(ctx)
    ctx.call(unit.gather)
    early = unit.tensor(0, shards[0].shape)  # as autograd holds a weight across the free
    ctx.call(unit.free)
    sizes, state, live = [st.nbytes() for st in unit.storages], unit.state, memory.live
    ctx.call(unit.free)  # freeing what is free does nothing
    twice = memory.live
    ctx.call(unit.gather)
    ctx.call(unit.wait)
    held = early.untyped_storage().nbytes()  # 0: its storage was replaced, not grown back
    again = early.clone() if held else None  # (reading a tensor on 0 bytes would crash)
    ctx.expect(sizes == [0, 0], f"the storages hold {sizes} bytes after free()",
               ["storage.resize_(0) for each of self.storages: the bytes go back, and the "
                "tensors on them stay valid"])
    ctx.expect(state == "free" and live == 0, f"after free() state is {state!r} and "
               f"self.memory counts {live} bytes", ["self.memory.count(-self.nbytes)"])
    ctx.expect(twice == 0, f"self.memory counts {twice} bytes after a second free()",
               ["free() a unit that is free already: nothing to do"])
    ctx.expect(held > 0, f"a weight tensor made before free() sits on a storage of {held} "
               "bytes after the next gather: not the one gathered into", [RESIZE_HINT])
    ctx.expect_close(again, full[0], "a weight tensor made before free(), after the next gather",
                     atol=0, hints=[RESIZE_HINT])


@grader.case("reduce-scatter: each rank gets its piece of the mean gradient, then adds")
def reduce_scatter(ctx):
    """Each rank's shard .grad becomes its piece of the mean gradient over the ranks, and a
    second backward's mean is added to it."""
    unit, shards, _, memory, _ = _unit(ctx)
    grads, means = _gradients(ctx, 100)
    more, more_means = _gradients(ctx, 200)
    ctx.call(unit.reduce_scatter, grads, True)
    ctx.call(unit.finish_reduce)
    first, live, left = [s.param.grad.clone() for s in shards], memory.live, len(unit.reducing)
    ctx.call(unit.reduce_scatter, more, True)  # a second backward without zero_grad
    ctx.call(unit.finish_reduce)
    second = [s.param.grad.clone() for s in shards]
    for name, got, mean, s in zip(("weight", "bias"), first, means, shards):
        ctx.expect_close(got, _my_piece(ctx, mean, s), f"{name}'s .grad (this rank's piece)",
                         atol=1e-6, rtol=1e-6)
    ctx.expect(live == 0 and left == 0, f"after finish_reduce() self.memory counts {live} "
               f"bytes and {left} reduce-scatters are in self.reducing",
               ["count each padded gradient in, and out again when its reduce-scatter is done"])
    for name, got, a, b, s in zip(("weight", "bias"), second, means, more_means, shards):
        ctx.expect_close(got, _my_piece(ctx, a + b, s), f"{name}'s .grad after a second "
                         "backward", atol=1e-6, rtol=1e-6,
                         hints=["a .grad that is there already gets the new mean added"])


@grader.case("no_sync: the full gradient kept, reduced with the next one")
def no_sync(ctx):
    """Under no_sync the full gradient is kept (nothing sent), and reduced together with the
    next synchronized backward's."""
    unit, shards, _, _, comm = _unit(ctx)
    grads, means = _gradients(ctx, 300)
    more, more_means = _gradients(ctx, 400)
    third, third_means = _gradients(ctx, 600)
    ctx.call(unit.reduce_scatter, grads, False)
    kept, issued = [s.param.grad for s in shards], [n for n, _ in comm.log]
    ctx.call(unit.reduce_scatter, more, True)
    ctx.call(unit.finish_reduce)
    second = [s.param.grad.clone() for s in shards]
    ctx.call(unit.reduce_scatter, third, True)  # synchronized again: nothing kept to add
    ctx.call(unit.finish_reduce)
    ctx.expect(kept == [None, None] and issued == [], f"under sync=False .grad is {kept} and "
               f"{issued} were issued", ["sync=False: keep the padded full gradient in "
                                         "s.accumulated, send nothing, leave .grad alone"])
    for name, got, s, a, b in zip(("weight", "bias"), second, shards, means, more_means):
        ctx.expect_close(got, _my_piece(ctx, a + b, s), f"{name}'s .grad after a "
                         "no_sync backward and a synchronized one", atol=1e-6, rtol=1e-6,
                         hints=["add s.accumulated to the padded gradient, then clear it"])
    for name, s, a, b, c in zip(("weight", "bias"), shards, means, more_means, third_means):
        ctx.expect_close(s.param.grad, _my_piece(ctx, a + b + c, s), f"{name}'s .grad after "
                         "one more synchronized backward", atol=1e-6, rtol=1e-6,
                         hints=["once a synchronized backward has sent s.accumulated, clear it "
                                "(s.accumulated = None): it must not be sent twice"])


@grader.case("the collectives go through self.comm.start, where FSDP counts its bytes")
def counted(ctx):
    """Every collective goes through self.comm.start: one all-gather and one reduce-scatter per
    shard, of the padded size, logged in order."""
    unit, shards, _, _, comm = _unit(ctx)
    ctx.call(unit.gather)
    ctx.call(unit.wait)
    grads, _ = _gradients(ctx, 500)
    ctx.call(unit.reduce_scatter, grads, True)
    ctx.call(unit.finish_reduce)
    want = [("all_gather", s.size * ctx.world_size * 4) for s in shards] + [
        ("reduce_scatter", s.size * ctx.world_size * 4) for s in shards]
    ctx.expect(comm.log == want, f"self.comm logged {comm.log}, expected {want}",
               ["start each collective with self.comm.start(name, *args): one all-gather and "
                "one reduce-scatter per shard, of the padded size"])


class _Watched(Counted):
    """torch's collectives, counted as FSDP's are; each all-gather's handle notes, when it is
    waited for, whether the unit's storages still held their bytes then."""

    def __init__(self, landed=False):
        super().__init__("torch")
        self.unit, self.waits, self.landed = None, [], landed

    def start(self, name, *args, count=True):
        work = super().start(name, *args, count=count)
        if self.landed:  # one rank: nothing to wait for, and a free() that does not wait
            work.wait()  # must fail on its line, not crash on where it freed
        return _Handle(work, self) if name == "all_gather" else work


class _Handle:
    def __init__(self, work, comm):
        self.work, self.comm = work, comm

    def wait(self):
        self.comm.waits.append(all(st.nbytes() > 0 for st in self.comm.unit.storages))
        return self.work.wait()


@grader.case("free() while the gather is in flight (rank 0 late): it waits for the gather first")
def free_in_flight(ctx):
    """free() called while the unit's all-gathers are in flight, rank 0 late: every gather
    is waited for while the storages still hold their bytes, and the next gather brings the
    weight back."""
    comm = _Watched(landed=ctx.world_size == 1)
    unit, shards, full, _, _ = _unit(ctx, comm=comm)
    comm.unit = unit
    if ctx.rank == 0:
        time.sleep(LATE)  # the others free while their gathers wait for rank 0's piece
    ctx.call(unit.gather)
    ctx.call(unit.free)
    started = sum(name == "all_gather" for name, _ in comm.log)
    waits = list(comm.waits)
    dist.barrier()
    ctx.expect(len(waits) >= started and all(waits), f"free() shrank the storages with "
               f"{started - sum(waits)} of {started} all-gathers not waited for: they still "
               "write into the storage (with a late peer: into freed memory)", [
                   "free(): wait for the gather in flight first (self.wait()), then "
                   "storage.resize_(0)"])
    ctx.call(unit.gather)
    ctx.call(unit.wait)
    ctx.expect_close(unit.tensor(0, shards[0].shape), full[0], "the weight gathered after the "
                     "free", atol=0)
