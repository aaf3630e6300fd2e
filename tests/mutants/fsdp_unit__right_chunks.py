"""A correct version written apart from the reference: torch.cat / F.pad for the padding, one
helper for a padded flat gradient, .grad accumulated with +=."""
import torch
import torch.nn.functional as F
from dist_sgd.shard.fsdp_unit import _Gather, itemsize


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
        if self.state != "free":
            return
        for i, shard in enumerate(self.shards):
            nbytes = self.numels[i] * itemsize(self.dtypes[i])
            self.storages[i].resize_(nbytes)
            chunks = list(self.tensor(i, (self.numels[i],)).chunk(self.world_size))
            mine = shard.param.detach().to(self.dtypes[i])
            self.works.append((self.comm.start("all_gather", chunks, mine), mine))
        self.memory.count(self.nbytes)
        self.state = "gathering"

    def wait(self):
        self.gather()
        for work, _ in self.works:
            work.wait()
        self.works, self.state = [], "gathered"

    def free(self):
        if self.state == "free":
            return
        self.wait()
        for storage in self.storages:
            storage.resize_(0)
        self.memory.count(-self.nbytes)
        self.state = "free"

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

    def _padded(self, shard, grad):
        extra = shard.size * self.world_size - shard.numel
        flat = torch.zeros(shard.numel, dtype=shard.param.dtype) if grad is None else \
            grad.reshape(-1).to(shard.param.dtype)
        flat = F.pad(flat, (0, extra))
        return flat if shard.accumulated is None else flat + shard.accumulated

    def reduce_scatter(self, grads, sync):
        for shard, grad in zip(self.shards, grads):
            if not shard.param.requires_grad:
                continue
            flat = self._padded(shard, grad)
            if not sync:
                shard.accumulated = flat
                continue
            shard.accumulated = None
            out = torch.empty(shard.size, dtype=shard.param.dtype)
            handle = self.comm.start("reduce_scatter", out, list(flat.chunk(self.world_size)))
            self.memory.count(flat.numel() * flat.element_size())
            self.reducing.append((shard, out, handle, flat))

    def finish_reduce(self):
        while self.reducing:
            shard, out, handle, flat = self.reducing.pop(0)
            handle.wait()
            mean = out / self.world_size
            if shard.param.grad is None:
                shard.param.grad = mean
            else:
                shard.param.grad += mean
            self.memory.count(-flat.numel() * flat.element_size())
