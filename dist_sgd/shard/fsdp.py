"""FullyShardedDataParallel from scratch: parameters, gradients and optimizer state sharded.

DDP (lessons 07-09) keeps on every rank a full copy of the parameters, the gradients and the
optimizer state; ZeRO-1 (lesson 13) shards only the state, so with float32 and Adam 8 of the
16 bytes per parameter stay on every rank however many ranks there are. FSDP (ZeRO-3) keeps
1/p of everything on each rank and builds a layer's full parameters only while it computes:

    model = FullyShardedDataParallel(Net())     # each rank keeps 1/p of every weight
    opt = torch.optim.Adam(model.parameters())  # steps the shards: its state is 1/p too
    loss = F.nll_loss(model(x), y)              # each unit: all-gather, compute, free
    loss.backward()                             # each unit: all-gather, gradient, reduce-scatter
    opt.step()

1. Shard. Every parameter with two or more dimensions (Linear, Conv, Embedding weights) is
   flattened, padded with zeros to a multiple of p and cut into p equal pieces: rank r's
   Parameter *is* piece r (module.weight.shape becomes (ceil(n/p),)). One-dimensional ones
   (biases, norm weights) stay whole on every rank and their gradients are all-reduced as in
   DDP: sharding them saves a few bytes for a message each (CS336's rule). shard_all=True
   shards them too, as torch's fully_shard does.
2. Gather, compute, free. A unit is a submodule that owns sharded parameters. Before it runs,
   its full parameters are all-gathered; after, they are freed (reshard_after_forward=True:
   ZeRO-3) or kept until its backward (False: ZeRO-2, one gather fewer, all units at once).
3. Reduce-scatter. The backward of an all-gather is a reduce-scatter: rank r needs only the
   sum of everyone's gradient over its own piece. Each unit's gradient is reduce-scattered as
   soon as autograd produces it, then divided by p (the mean over ranks, as in DDP).
4. Prefetch. The next `prefetch` units' all-gathers start while the current unit computes,
   in forward and in backward, so the wire works while the cores do; at most 1 + prefetch
   units are gathered at once (CS336: gather a layer once the one two before it is done).

Bytes each rank sends per step, N = the parameters' bytes: DDP's all-reduce 2(p-1)/p N;
ZeRO-3 gathers twice and reduces once, 3(p-1)/p N = 1.5x; ZeRO-2 1.0x (bytes_per_step()
counts what the last step issued); memory() what a rank holds, tensor by tensor.
compute_dtype=torch.float16 / bfloat16: the shards are cast
before the all-gather (half the bytes) and the module computes in that dtype (floating inputs
are cast, outputs come out in it); shards, gradients (reduced in float32) and optimizer state
stay float32. collectives="ours": dist_sgd.comm.collectives' all_gather / reduce_scatter /
all_reduce (run on the one ordered helper thread of dist_sgd.ddp.hooks), "torch": torch's.

Not supported, with a clear error: sparse gradients; wrapping twice; an optimizer built from
the parameters of before the wrapping; a parameter that gets no gradient in a backward pass
(every rank must use every parameter, as torch DDP without find_unused_parameters). Buffers
(BatchNorm statistics) are not synchronized, as in torch's fully_shard. Checkpoints:
state_dict() is the plain module's, gathered (see fsdp_io.py).
"""
import contextlib

import torch
import torch.nn as nn

from dist_sgd.comm import collectives as ours
from dist_sgd.ddp.hooks import call_when_backward_ends
from dist_sgd.faults import fsdp_checkpoint
from dist_sgd.plumbing.rank import world
from dist_sgd.shard import fsdp_io
from dist_sgd.shard.fsdp_io import Counted, cast, check_module, itemsize, retire, tensors
from dist_sgd.sgd.sync import broadcast_parameters


class _Shard:
    """One sharded parameter: this rank's piece (the Parameter the module now holds), and the
    shape, numel and piece size ceil(n/p) that rebuild the whole."""

    def __init__(self, param, rank, world_size):
        self.shape, self.numel = param.shape, param.numel()
        self.size = -(-self.numel // world_size)
        piece = param.detach().reshape(-1)[rank * self.size:(rank + 1) * self.size]
        data = param.new_zeros(self.size)  # the padding (on the last ranks) stays zero
        data[:piece.numel()] = piece
        self.param = nn.Parameter(data, requires_grad=param.requires_grad)
        self.accumulated = None  # under no_sync: the full gradient, summed over backwards


class _Unit:
    """A module owning sharded parameters. Its gathered full parameters live in storages that
    are resized to 0 bytes when freed: tensors autograd saved come back when re-gathered."""

    def __init__(self, name, module, names, shards, compute_dtype, world_size):
        self.name, self.module, self.names, self.shards = name, module, names, shards
        self.dtypes = [compute_dtype or s.param.dtype for s in shards]
        self.storages = [torch.empty(0, dtype=d, device=s.param.device).untyped_storage()
                         for s, d in zip(shards, self.dtypes)]
        self.numels = [s.size * world_size for s in shards]  # gathered, padding included
        self.nbytes = sum(n * itemsize(d) for n, d in zip(self.numels, self.dtypes))
        self.works, self.state, self.owed = [], "free", 0

    def tensor(self, i, shape):
        """A fresh tensor on shard i's gathered storage: autograd's saved ones see no write."""
        return torch.empty(0, dtype=self.dtypes[i], device=self.shards[i].param.device).set_(
            self.storages[i], 0, shape)

    def full(self, i):
        return self.tensor(i, self.shards[i].shape)


class _Gather(torch.autograd.Function):
    """Shards in, full parameters out (gathered before); its backward reduce-scatters."""

    @staticmethod
    def forward(ctx, fsdp, unit, *shards):
        ctx.fsdp, ctx.unit = fsdp, unit
        return tuple(unit.full(i) for i in range(len(shards)))

    @staticmethod
    def backward(ctx, *grads):
        ctx.fsdp._post_backward(ctx.unit, grads)
        return (None, None) + (None,) * len(grads)  # the shards' .grad: written when reduced


class FullyShardedDataParallel(nn.Module):
    """See the module docstring. prefetch: how many units are gathered ahead (0: none)."""

    def __init__(self, module, compute_dtype=None, reshard_after_forward=True, shard_all=False,
                 prefetch=1, collectives="torch", init_sync=True):
        super().__init__()
        self.rank, self.world_size = world("FullyShardedDataParallel")
        check_module(module, prefetch)
        self.comm, self.module, self.compute_dtype = Counted(collectives), module, compute_dtype
        self.reshard_after_forward, self.prefetch = reshard_after_forward, prefetch
        if init_sync:  # every rank cuts its pieces from rank 0's weights
            broadcast = ours.broadcast if collectives == "ours" else None
            broadcast_parameters(module, broadcast=broadcast)
        self.units, self.replicated, made = [], {}, {}
        self._mname = {}  # module -> its name in the module (for error messages)
        for mname, m in module.named_modules():
            self._mname[m] = mname
            names, shards = [], []
            for pname, p in list(m._parameters.items()):
                if p is None:
                    continue
                if p.numel() and (shard_all or p.dim() >= 2):
                    s = made.setdefault(id(p), None) or _Shard(p, self.rank, self.world_size)
                    made[id(p)] = s  # a tied parameter: one shard, gathered by each user
                    m._parameters[pname] = s.param  # the same name and place: now the piece
                    retire(p)  # an optimizer built from the old parameter refuses to step
                    names.append(pname)
                    shards.append(s)
                else:
                    self.replicated.setdefault(m, []).append(pname)
            if shards:
                self.units.append(_Unit(mname, m, names, shards, compute_dtype, self.world_size))
        module._fsdp_wrapped = True
        pieces = {id(s.param): s for s in made.values()}  # every name of a piece (tied: several)
        self.shards_by_name = {n: pieces[id(p)] for n, p in
                               module.named_parameters(remove_duplicate=False) if id(p) in pieces}
        self._unit_of = {u.module: u for u in self.units}
        for m in set(self.replicated) | set(self._unit_of):
            m.register_forward_pre_hook(self._pre_forward)
            m.register_forward_hook(self._post_forward)
        for p in {id(p): p for m, names in self.replicated.items()
                  for p in (m._parameters[n] for n in names) if p.requires_grad}.values():
            p.register_post_accumulate_grad_hook(self._replicated_ready)
        self.require_backward_grad_sync, self._in_backward, self._in_flight = True, False, []
        self._plan, self._order, self._live, self.peak_live = list(self.units), [], 0, 0
        self._open_step()

    # ---- gather and free: the full parameters exist only between these two ---------------

    def _gather(self, unit):
        if unit.state != "free":
            return
        for i, (s, storage, numel) in enumerate(zip(unit.shards, unit.storages, unit.numels)):
            storage.resize_(numel * itemsize(unit.dtypes[i]))
            flat = unit.tensor(i, (numel,))
            piece = s.param.detach().to(unit.dtypes[i])  # cast first: float16 halves the bytes
            work = self.comm.start("all_gather", list(flat.split(s.size)), piece)
            unit.works.append((work, piece))  # the piece stays alive until the gather is done
        unit.state = "gathering"
        self._count(unit.nbytes)

    def _wait(self, unit):
        self._gather(unit)
        for work, _ in unit.works:
            work.wait()
        unit.works, unit.state = [], "gathered"

    def _free(self, unit):
        if unit.state != "free":
            self._wait(unit)  # a gather in flight writes into the storage: let it land first
            for storage in unit.storages:
                storage.resize_(0)
            unit.state = "free"
            self._count(-unit.nbytes)

    def _count(self, nbytes):
        self._live += nbytes
        self.peak_live = max(self.peak_live, self._live)

    # ---- forward ------------------------------------------------------------------------

    def forward(self, *args, **kwargs):
        if not self._in_backward:
            self._open_step()
        if self.compute_dtype is not None:
            args, kwargs = cast((args, kwargs), self.compute_dtype)
        out = self.module(*args, **kwargs)
        if not torch.is_grad_enabled():  # no backward will come: nothing stays gathered
            for unit in self.units:
                self._free(unit)
        return out

    def _open_step(self):
        """A step starts at each forward: the order of units seen becomes the next plan."""
        self._plan = self._order or self._plan
        for unit in self.units:
            self._free(unit)
            unit.owed = 0
        self.comm.log.clear()
        self.peak_live = self._live
        self._order, self._ran, self._reduces = [], [], []
        self._ran_modules, self._got = set(), set()
        self._sync = self.require_backward_grad_sync  # decided at forward, as in DDP

    def _pre_forward(self, module, args):
        if torch.is_grad_enabled():
            self._ran_modules.add(module)
        for pname in self.replicated.get(module, []) if self.compute_dtype else []:
            p = module._parameters[pname]
            module.__dict__[pname] = p.to(self.compute_dtype)  # differentiable: grads stay fp32
        unit = self._unit_of.get(module)
        if unit is None:
            return
        k = len(self._order)
        self._order.append(unit)
        self._wait(unit)
        if k < len(self._plan) and self._plan[k] is unit:  # as last step: gather ahead
            for ahead in self._plan[k + 1:k + 1 + self.prefetch]:
                self._gather(ahead)
        shards = [s.param for s in unit.shards]
        if torch.is_grad_enabled() and any(p.requires_grad for p in shards):
            fulls = _Gather.apply(self, unit, *shards)
            unit.owed += 1  # a backward is due
        else:
            fulls = [unit.full(i) for i in range(len(shards))]
        for pname, full in zip(unit.names, fulls):
            module.__dict__[pname] = full  # found before _parameters: the module computes on it

    def _post_forward(self, module, args, output):
        unit = self._unit_of.get(module)
        for pname in self.replicated.get(module, []) + (unit.names if unit else []):
            module.__dict__.pop(pname, None)  # module.weight is the piece again
        if unit is None:
            return
        if torch.is_grad_enabled():
            self._ran.append(unit)
            for t in tensors(output):  # autograd reaches the unit's output: its backward starts
                if t.requires_grad:
                    t.register_hook(lambda grad, u=unit: self._pre_backward(u))
        if self.reshard_after_forward or not torch.is_grad_enabled():
            self._free(unit)

    # ---- backward -----------------------------------------------------------------------

    def _backward_starts(self):
        if not self._in_backward:
            self._in_backward, self._next = True, len(self._ran) - 1
            call_when_backward_ends(self.finish_gradient_synchronization)

    def _pre_backward(self, unit):
        """Re-gather the unit (ZeRO-3) and start gathering the next ones in backward order."""
        self._backward_starts()
        self._wait(unit)
        where = [j for j in range(self._next, -1, -1) if self._ran[j] is unit]
        if where:
            self._next = where[0]
            for j in range(where[0] - 1, max(where[0] - 1 - self.prefetch, -1), -1):
                self._gather(self._ran[j])

    def _post_backward(self, unit, grads):
        """The unit's full gradients: free the unit, reduce-scatter each into its shard."""
        self._backward_starts()
        unit.owed -= 1
        self._free(unit)
        if self._sync:
            self._drain()  # one unit's reduce-scatters in flight at a time: memory stays bounded
        for s, grad in zip(unit.shards, grads):
            if not s.param.requires_grad:
                continue
            if (grad is not None and s.numel == s.size * self.world_size and grad.is_contiguous()
                    and grad.dtype == s.param.dtype and s.accumulated is None):
                flat = grad.view(-1)  # no padding needed: reduce autograd's tensor, no copy
            else:
                flat = s.param.new_zeros(s.size * self.world_size)  # padded, the shard's dtype
                if grad is not None:
                    flat[:s.numel] = grad.reshape(-1)
                if s.accumulated is not None:
                    flat += s.accumulated
            if not self._sync:  # no_sync: keep the full sum for the next synchronized backward
                s.accumulated = flat
                continue
            s.accumulated, out = None, s.param.new_empty(s.size)
            work = self.comm.start("reduce_scatter", out, list(flat.split(s.size)))
            self._in_flight.append((s, out, work, flat))
            self._count(flat.numel() * flat.element_size())

    def _drain(self):
        for s, out, work, flat in self._in_flight:
            work.wait()
            out.div_(self.world_size)  # the sum over ranks -> the mean
            s.param.grad = out if s.param.grad is None else s.param.grad.add_(out)
            self._count(-flat.numel() * flat.element_size())
        self._in_flight = []

    def _replicated_ready(self, param):
        self._backward_starts()
        self._got.add(id(param))
        if self._sync:
            param.grad.div_(self.world_size)  # divide first, then sum: the mean, as DDP does
            self._reduces.append(self.comm.start("all_reduce", param.grad))

    def finish_gradient_synchronization(self):
        """Wait for every reduction in flight: after it, every Parameter's .grad has the shape
        and dtype of its data. Autograd calls it when backward ends; again, it does nothing."""
        if not self._in_backward:
            return
        try:
            self._drain()
            for work in self._reduces:
                work.wait()
            missing = sorted({u.name for u in self._ran if u.owed > 0} | {
                f"{self._mname[m]}.{n}".lstrip(".") for m in self._ran_modules
                for n in self.replicated.get(m, [])
                if m._parameters[n].requires_grad and id(m._parameters[n]) not in self._got})
            if missing:
                raise RuntimeError(f"FullyShardedDataParallel on rank {self.rank}: {missing} got "
                                   "no gradient in this backward pass; every rank must use every "
                                   "parameter in every step (collectives pair up by order). Freeze "
                                   "what is unused (requires_grad_(False)) before wrapping")
        finally:
            self._reduces, self._in_backward = [], False
            for unit in self.units:
                self._free(unit)
                unit.owed = 0

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside accumulate gradients without communicating (at full size,
        as in torch); the first backward after it reduce-scatters the sum."""
        previous, self.require_backward_grad_sync = self.require_backward_grad_sync, False
        try:
            yield
        finally:
            self.require_backward_grad_sync = previous

    # ---- what a rank holds and sends; checkpoints in the plain module's layout -------------

    def bytes_per_step(self):
        """Bytes this rank sent in the last forward and backward, counted from the collectives."""
        return self.comm.bytes_sent(self.world_size)

    def memory(self):
        """Bytes this rank holds, tensor by tensor: params (pieces and replicated), grads (and
        no_sync's full sums), buffers (gathered units, gradients being reduced) now, and
        peak_buffers, the most buffers held at once since the last forward began."""
        params = list(self.parameters())
        held = [p.grad for p in params if p.grad is not None] + [
            s.accumulated for s in self.shards_by_name.values() if s.accumulated is not None]
        nbytes = lambda ts: sum(t.numel() * t.element_size() for t in ts)  # noqa: E731
        return {"params": nbytes(params), "grads": nbytes({id(g): g for g in held}.values()),
                "buffers": self._live, "peak_buffers": self.peak_live}

    def gather_full_params(self):
        """{name: full tensor} under the module's own names (collective: every rank calls)."""
        return fsdp_io.gather_full_params(self)

    def state_dict(self, destination=None, prefix="", keep_vars=False):
        """The plain module's state_dict, full and gathered, on every rank (collective)."""
        return fsdp_checkpoint.full_state_dict(self, destination, prefix)

    def load_state_dict(self, state_dict, strict=True, assign=False):
        """Load a plain module's (full) state_dict: each rank keeps its pieces."""
        return fsdp_checkpoint.load_full_state_dict(self, state_dict, strict)
