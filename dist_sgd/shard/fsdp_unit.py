"""One FSDP unit: a module's sharded parameters gathered, freed and reduce-scattered.

Every parameter with two or more dimensions is flattened, padded with zeros to a multiple of p
and cut into p equal pieces: rank r's Parameter *is* piece r (a _Shard). A unit (_Unit,
torch's FSDPParamGroup) is a module and the sharded parameters of its subtree that no unit
inside it owns (owners()): before it runs, its full parameters are all-gathered into storages
of their own; after, those storages shrink to 0 bytes (free) until the next gather. The
backward of an all-gather is a reduce-scatter: rank r needs only the sum of everyone's
gradient over its own piece, divided by p for the mean (_Gather). The wrapper
(dist_sgd/shard/fsdp.py) decides when each unit does what; _Memory counts the bytes held.
"""
import torch
import torch.nn as nn

from dist_sgd.plumbing.mine import swap_in

def itemsize(dtype):
    """Bytes per element of dtype (4 for float32, 2 for bfloat16)."""
    return torch.empty(0, dtype=dtype).element_size()  # on the CPU: only its size is read


class _Memory:
    """The bytes of the buffers held now (gathered units, gradients being reduced), and the
    most held at once since the last reset."""

    def __init__(self):
        self.live = self.peak = 0

    def count(self, nbytes):
        self.live += nbytes
        self.peak = max(self.peak, self.live)


# ---- one parameter's piece, and one unit's gather, free and reduce-scatter ----------------

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
    """A module and the sharded parameters of its subtree that no unit inside it owns, as
    torch's FSDPParamGroup: it gathers them, waits, frees them and reduce-scatters their
    gradients; the wrapper decides when. The gathered full parameters live in storages that
    are resized to 0 bytes when freed: tensors autograd saved come back when re-gathered.

    state: "free" (storages of 0 bytes) -> gather(): "gathering" (self.works: the (handle,
    piece) of each all-gather in flight) -> wait(): "gathered" -> free(): "free". Collectives
    go through self.comm.start(name, *args) (counted, asynchronous: a handle with .wait()),
    with torch's in-place signatures: start("all_gather", output_list, tensor),
    start("reduce_scatter", output, input_list), start("all_reduce", tensor).
    self.memory.count(+/- bytes) follows the buffers held; self.reducing: the (shard, out,
    handle, flat) of each reduce-scatter in flight.

    self.shards[i] (a _Shard): .param, this rank's piece (a flat Parameter of .size elements,
    zero-padded on the last ranks), .shape and .numel of the whole parameter, .size =
    ceil(numel / p), and .accumulated (None, or under no_sync the padded full gradient summed
    over backwards). self.storages[i], self.numels[i] (size * p) and self.dtypes[i] (the
    compute dtype): shard i's gathered storage; self.tensor(i, shape) views it."""

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
        # ---- exercise fsdp_unit: grow each storage, start all-gathering the pieces into it
        for i, (s, storage, numel) in enumerate(zip(self.shards, self.storages, self.numels)):
            storage.resize_(numel * itemsize(self.dtypes[i]))
            flat = self.tensor(i, (numel,))
            piece = s.param.detach().to(self.dtypes[i])  # cast first: float16 halves the bytes
            work = self.comm.start("all_gather", list(flat.split(s.size)), piece)
            self.works.append((work, piece))  # the piece stays alive until the gather is done
        self.state = "gathering"
        self.memory.count(self.nbytes)
        # ---- end of exercise

    def wait(self):
        self.gather()
        for work, _ in self.works:
            work.wait()
        self.works, self.state = [], "gathered"

    def free(self):
        """Give the full parameters' bytes back; the tensors on the storages stay valid."""
        # ---- exercise fsdp_unit: wait for a gather in flight, then shrink each storage to 0
        if self.state != "free":
            self.wait()  # a gather in flight writes into the storage: let it land first
            for storage in self.storages:
                storage.resize_(0)
            self.state = "free"
            self.memory.count(-self.nbytes)
        # ---- end of exercise

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
        # ---- exercise fsdp_unit: pad each gradient (plus no_sync's sum), start reduce-scatters
        for s, grad in zip(self.shards, grads):
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
            if not sync:
                s.accumulated = flat
                continue
            s.accumulated, out = None, s.param.new_empty(s.size)
            work = self.comm.start("reduce_scatter", out, list(flat.split(s.size)))
            self.reducing.append((s, out, work, flat))
            self.memory.count(flat.numel() * flat.element_size())
        # ---- end of exercise

    def finish_reduce(self):
        """Wait for the reduce-scatters in flight; each shard's .grad gets the mean."""
        # ---- exercise fsdp_unit: wait for each, divide by p, set or add to the shard's .grad
        for s, out, work, flat in self.reducing:
            work.wait()
            out.div_(self.world_size)  # the sum over ranks -> the mean
            s.param.grad = out if s.param.grad is None else s.param.grad.add_(out)
            self.memory.count(-flat.numel() * flat.element_size())
        self.reducing = []
        # ---- end of exercise


class _Gather(torch.autograd.Function):
    """Shards in, full parameters out (gathered before); its backward reduce-scatters."""

    @staticmethod
    def forward(ctx, post_backward, unit, *shards):
        ctx.post_backward, ctx.unit = post_backward, unit
        return tuple(unit.tensor(i, s.shape) for i, s in enumerate(unit.shards))

    @staticmethod
    def backward(ctx, *grads):
        ctx.post_backward(ctx.unit, grads)
        return (None, None) + (None,) * len(grads)  # the shards' .grad: written when reduced


def owners(module, chosen):
    """{submodule: the chosen module nearest above it (itself included)}: whose unit holds its
    parameters, as torch's fully_shard assigns a parameter to the innermost call around it."""
    owner = {}

    def walk(m, own):
        own = m if m in chosen else own
        owner.setdefault(m, own)  # a module reached twice stays with the first
        for child in m.children():
            walk(child, own)

    walk(module, module)
    return owner


# DIST_SGD_MINE: a learner's version replaces this one
swap_in(globals(), "fsdp_unit", ("_Unit",), lesson="16")
