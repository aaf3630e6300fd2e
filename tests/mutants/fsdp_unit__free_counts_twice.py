"""free() always shrinks and counts the bytes out, even when the unit is free already: a
second free() (FSDP frees after forward and again after backward) counts -nbytes once
more, and the memory account goes negative. Freeing what is free does nothing."""
import torch
from dist_sgd.shard.fsdp import _Gather, itemsize


CAUGHT_BY = "free: 0 bytes held; a tensor made before comes back with the next gather"
HINT = "free() a unit that is free already: nothing to do"


class _Unit:
    """A module and the sharded parameters of its subtree that no unit inside it owns, as
    torch's FSDPParamGroup: it gathers them, waits, frees them and reduce-scatters their
    gradients; the wrapper decides when. The gathered full parameters live in storages that
    are resized to 0 bytes when freed: tensors autograd saved come back when re-gathered.

    state: "free" (storages of 0 bytes) -> gather(): "gathering" (self.works: the (handle,
    piece) of each all-gather in flight) -> wait(): "gathered" -> free(): "free". Collectives
    go through self.comm.start(name, *args) (counted, asynchronous: a handle with .wait());
    self.memory.count(+/- bytes) follows the buffers held; self.reducing: the (shard, out,
    handle, flat) of each reduce-scatter in flight."""

    def __init__(self, name, module, places, shards, compute_dtype, comm, memory, world_size):
        self.name, self.module, self.shards = name, module, shards
        self.places = places  # (submodule, parameter name, index in shards): where each goes
        self.comm, self.memory, self.world_size = comm, memory, world_size
        self.dtypes = [compute_dtype or s.param.dtype for s in shards]
        self.storages = [torch.empty(0, dtype=d, device=s.param.device).untyped_storage()
                         for s, d in zip(shards, self.dtypes)]
        self.numels = [s.size * world_size for s in shards]  # gathered, padding included
        self.nbytes = sum(n * itemsize(d) for n, d in zip(self.numels, self.dtypes))
        self.works, self.state, self.reducing = [], "free", []

    def tensor(self, i, shape):
        """A fresh tensor on shard i's gathered storage: autograd's saved ones see no write."""
        return torch.empty(0, dtype=self.dtypes[i], device=self.shards[i].param.device).set_(
            self.storages[i], 0, shape)

    def gather(self):
        """Start the all-gathers of every shard into the full storages (nothing if started)."""
        if self.state != "free":
            return
        for i, s in enumerate(self.shards):
            self.storages[i].resize_(self.numels[i] * itemsize(self.dtypes[i]))
            pieces = list(self.tensor(i, (self.numels[i],)).split(s.size))
            mine = s.param.detach().to(self.dtypes[i])
            self.works.append((self.comm.start("all_gather", pieces, mine), mine))
        self.state = "gathering"
        self.memory.count(self.nbytes)

    def wait(self):
        self.gather()
        for work, _ in self.works:
            work.wait()
        self.works, self.state = [], "gathered"

    def free(self):
        """Give the full parameters' bytes back; the tensors on the storages stay valid."""
        self.wait() if self.state == "gathering" else None
        for storage in self.storages:
            storage.resize_(0)
        self.state = "free"
        self.memory.count(-self.nbytes)

    def install(self, post_backward=None):
        """Put the full parameters where the modules find them (module.__dict__ comes before
        _parameters). post_backward given: through _Gather, whose backward calls it; else
        plain tensors on the same storages (no_grad, or activation checkpointing's recompute,
        whose graph autograd never runs backward through)."""
        self.wait()
        pieces = [s.param for s in self.shards]
        trained = any(p.requires_grad for p in pieces)
        if post_backward is not None and trained:
            fulls = _Gather.apply(post_backward, self, *pieces)
        else:  # recompute: requires_grad as _Gather's outputs, so autograd saves the same
            fulls = [self.tensor(i, s.shape).requires_grad_(trained and torch.is_grad_enabled())
                     for i, s in enumerate(self.shards)]
        for module, pname, i in self.places:
            module.__dict__[pname] = fulls[i]

    def uninstall(self):
        for module, pname, _ in self.places:
            module.__dict__.pop(pname, None)  # module.weight is the piece again

    def reduce_scatter(self, grads, sync):
        """Start reducing each full gradient into its shard's .grad (sync); under no_sync keep
        the full sum for the next synchronized backward instead."""
        for s, grad in zip(self.shards, grads):
            if not s.param.requires_grad:
                continue
            flat = s.param.new_zeros(s.size * self.world_size)
            if grad is not None:
                flat[:s.numel] = grad.reshape(-1)
            if s.accumulated is not None:
                flat += s.accumulated
            if not sync:
                s.accumulated = flat
                continue
            s.accumulated = None
            out = s.param.new_empty(s.size)
            work = self.comm.start("reduce_scatter", out, list(flat.split(s.size)))
            self.reducing.append((s, out, work, flat))
            self.memory.count(flat.numel() * flat.element_size())

    def finish_reduce(self):
        """Wait for the reduce-scatters in flight; each shard's .grad gets the mean."""
        for s, out, work, flat in self.reducing:
            work.wait()
            out.div_(self.world_size)
            if s.param.grad is None:
                s.param.grad = out
            else:
                s.param.grad.add_(out)
            self.memory.count(-flat.numel() * flat.element_size())
        self.reducing = []
