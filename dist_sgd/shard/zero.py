"""ZeRO stage 1: every rank keeps the optimizer state of only its own 1/p of the parameters.

Data parallelism keeps on every rank a full copy of the parameters, the gradients and the
optimizer state; for Adam the state is two more tensors per parameter (exp_avg, exp_avg_sq),
so it is the largest of the three. ZeRO-1 (Rajbhandari et al. 2020) partitions the parameters
into p shards, one per rank; each rank runs the optimizer on its shard only (so only it holds
that shard's state), then the ranks share the updated parameters. Memory per parameter, in
bytes, with 4-byte params and grads and K bytes of optimizer state (Adam in float32: K = 8):

    plain data parallel: 4 + 4 + K          ZeRO-1: 4 + 4 + K / p

    opt = ShardedOptimizer(model.parameters(), torch.optim.Adam, lr=1e-3)
    loss.backward()
    opt.step()              # gradients -> this rank's shard updated -> parameters shared

Two communication schemes (scheme="broadcast", torch's: 1.5x the bytes of plain data
parallelism; "all_gather", DeepSpeed's: 1.0x), and what happens to gradients DDP already
averaged: ShardedOptimizer's docstring.
"""
import torch
import torch.distributed as dist

from dist_sgd.comm import collectives as ours
from dist_sgd.comm.counted import wire_bytes
from dist_sgd.comm.flat import copy_back, flatten
from dist_sgd.plumbing.mine import swap_in
from dist_sgd.plumbing.rank import world
from dist_sgd.sgd.sync import average_gradients, gradients_to_sync

SCHEMES = ("broadcast", "all_gather")
COLLECTIVES = {"torch": dist, "ours": ours}  # the same in-place signatures


def partition(sizes_per_group, world_size, loads=None):
    """Owner rank of every parameter: sorted-greedy, group by group (torch's algorithm).

    sizes_per_group: for each group, the numel of each parameter (None: not trainable, no
    owner). Within a group the largest goes first, each to the least-loaded rank so far
    (ties: the lowest rank); loads carry over from group to group, so adding a group later
    leaves every earlier owner where it was. Deterministic: every rank computes the same.
    Returns (owners per group, loads per rank).
    """
    loads = list(loads) if loads is not None else [0] * world_size
    owners = []
    for sizes in sizes_per_group:
        mine = [None] * len(sizes)
        order = sorted((i for i, n in enumerate(sizes) if n is not None), key=lambda i: -sizes[i])
        for i in order:  # sorted() is stable: equal sizes keep their order
            rank = loads.index(min(loads))
            mine[i], loads[rank] = rank, loads[rank] + sizes[i]
        owners.append(mine)
    return owners, loads


class ShardedOptimizer(torch.optim.Optimizer):
    """optimizer_class(**kwargs) over this rank's shard; step() shares the result.

    A torch.optim.Optimizer itself (LR schedulers accept it): param_groups hold every
    parameter and the options; the wrapped optimizer (.optim) holds this rank's parameters
    only, and .state is its state. Saving is torch's ZeroRedundancyOptimizer idiom: every rank
    calls consolidate_state_dict(to=r) (a collective), then state_dict() on rank r returns the
    plain optimizer's layout, which loads into optimizer_class(params) and back, and into a
    ShardedOptimizer at any world size (load_state_dict keeps this rank's shard of it).

    Two communication schemes (scheme=...), N = the bytes of all gradients:
      "broadcast"  (torch's ZeroRedundancyOptimizer): all-reduce every gradient (each rank sends
          2(p-1)/p N), step the own shard, then each rank broadcasts its updated parameters
          ((p-1)/p N): 1.5x the bytes of plain data parallelism. Every rank ends with every
          averaged gradient.
      "all_gather" (DeepSpeed's): reduce-scatter the gradients, so each rank receives the average
          of its own shard only ((p-1)/p N), step, all-gather the parameters ((p-1)/p N): 1.0x.
          Shards differ in size (whole parameters), so both collectives pad every shard to the
          largest: the bytes counted include the padding.

    Gradients already averaged (reduce_gradients=False): under our DistributedDataParallel, or after
    dist_sgd.sgd.sync.average_gradients, every rank already holds the averaged gradient of every
    parameter. Reducing again would be wrong twice over: an all-reduce sums p copies of the mean (p
    times too large unless divided again) and costs 2(p-1)/p N for nothing. So then both schemes
    skip the gradient step and only share the parameters (broadcast or all-gather): the same (p-1)/p
    N either way, on top of the 2(p-1)/p N the DDP all-reduce spent, i.e. 1.5x. DeepSpeed's 1.0x
    needs the optimizer to own the gradient communication: reduce_gradients=True, no DDP.

    collectives="torch" uses torch.distributed's; "ours" dist_sgd.comm.collectives' (from
    send/recv). Every rank must see the same parameters in the same order, and the same parameters
    without a gradient (as for average_gradients). Parameters with requires_grad=False when they are
    handed over belong to no shard (an optimizer never updates them); to train them later, add them
    with add_param_group. All trainable parameters must share one dtype and device (one flat
    buffer).
    """

    def __init__(self, params, optimizer_class, scheme="broadcast", collectives="torch",
                 reduce_gradients=True, **kwargs):
        if scheme not in SCHEMES:
            raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
        if collectives not in COLLECTIVES:
            raise ValueError(f"collectives must be one of {tuple(COLLECTIVES)}, "
                             f"got {collectives!r}")
        self.rank, self.world_size = world("ShardedOptimizer")
        self.scheme, self.comm = scheme, COLLECTIVES[collectives]
        self.reduce_gradients = reduce_gradients
        self.owners, self.loads, self.comm_log = [], [0] * self.world_size, []
        self.optim = None  # Optimizer.__init__ calls add_param_group before we can shard
        super().__init__(params, dict(kwargs))
        self.owners, self.loads = partition(self._sizes(self.param_groups), self.world_size)
        # ---- exercise ShardedOptimizer: the wrapped optimizer, over this rank's shard only
        local = [self._local_group(g, o) for g, o in zip(self.param_groups, self.owners)]
        self.optim = optimizer_class(local, **kwargs)
        # ---- end of exercise
        self._consolidated = None  # (rank it was gathered to, state_dict): see state_dict()
        self._copy_options_back()
        self.state = self.optim.state  # this rank's shard only: the point of ZeRO

    # ---- partitioning --------------------------------------------------------------------

    @staticmethod
    def _sizes(groups):
        return [[p.numel() if p.requires_grad else None for p in g["params"]] for g in groups]

    def _local_group(self, group, owners):
        return {**group, "params": [p for p, r in zip(group["params"], owners) if r == self.rank]}

    def _copy_options_back(self):
        """The wrapped optimizer filled in its defaults (betas, ...): show them here too.
        Only missing keys: our param_groups are the truth (an LR scheduler writes there)."""
        for group, local in zip(self.param_groups, self.optim.param_groups):
            for k, v in local.items():
                group.setdefault(k, v)

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        if self.optim is None:
            return  # still in __init__: the whole list is sharded there
        self._consolidated = None
        sizes = self._sizes(self.param_groups[-1:])
        owners, self.loads = partition(sizes, self.world_size, self.loads)
        self.owners += owners
        self.optim.add_param_group(self._local_group(self.param_groups[-1], owners[0]))
        self._copy_options_back()

    def shard(self, rank=None):
        """The parameters `rank` (default: this one) owns, in param_groups order."""
        rank = self.rank if rank is None else rank
        return [p for g, o in zip(self.param_groups, self.owners)
                for p, r in zip(g["params"], o) if r == rank]

    def _trainable(self):
        return [p for g, o in zip(self.param_groups, self.owners)
                for p, r in zip(g["params"], o) if r is not None]

    # ---- the step --------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure=None, **kwargs):
        loss = None
        if closure is not None:  # gradients first: they are what we communicate
            with torch.enable_grad():
                loss = closure()
        for group, local in zip(self.param_groups, self.optim.param_groups):
            # An LR scheduler changed our param_groups: the wrapped optimizer must see it.
            local.update({k: v for k, v in group.items() if k != "params"})
        self.comm_log, self._consolidated = [], None  # a consolidated copy is stale now
        shards = [self.shard(r) for r in range(self.world_size)]
        if not any(shards):
            return loss  # nothing trainable: nothing to update or share
        self._check_flat(shards)
        if self.scheme == "broadcast":
            # ---- exercise ShardedOptimizer: average the gradients, step the shard, share it
            if self.reduce_gradients:  # every gradient averaged everywhere, as plain DDP does
                n = sum(g.numel() * g.element_size() for g in gradients_to_sync(self._trainable()))
                average_gradients(self._trainable(), flat=True, all_reduce=self.comm.all_reduce)
                self.comm_log.append(("all_reduce", n))
            self.optim.step(**kwargs)
            self._broadcast_shards(shards)
            # ---- end of exercise
        else:
            if self.reduce_gradients:  # only this rank's shard of the average arrives here
                self._reduce_scatter_gradients(shards)
            self.optim.step(**kwargs)
            self._all_gather_shards(shards)
        return loss

    def _check_flat(self, shards):
        kinds = {(p.dtype, p.device) for s in shards for p in s}
        if len(kinds) > 1:
            raise ValueError(f"ShardedOptimizer flattens every shard into one buffer, so all "
                             f"trainable parameters need one dtype and device; got "
                             f"{sorted(map(str, kinds))}")

    def _padded(self, shards):
        """The largest shard's numel: reduce_scatter / all_gather need equal chunks."""
        return max(sum(p.numel() for p in s) for s in shards)

    def _reduce_scatter_gradients(self, shards):
        size, like = self._padded(shards), self._trainable()[0]
        chunks = []
        for s in shards:  # rank r's chunk: its parameters' gradients, zeros where none
            chunk = like.new_zeros(size)
            flatten([p.grad if p.grad is not None else torch.zeros_like(p) for p in s], out=chunk)
            chunks.append(chunk)
        mine = like.new_empty(size)
        self.comm.reduce_scatter(mine, chunks, op=dist.ReduceOp.SUM)
        mine.div_(self.world_size)  # a sum over ranks -> the mean (gloo has no AVG)
        # Every rank skips the same gradient-less parameters (see the module docstring).
        copy_back(mine, [p.grad for p in shards[self.rank]], like=shards[self.rank])
        self.comm_log.append(("reduce_scatter", size * like.element_size() * self.world_size))

    def _all_gather_shards(self, shards):
        size, like = self._padded(shards), self._trainable()[0]
        mine = like.new_zeros(size)
        flatten(shards[self.rank], out=mine)
        gathered = [like.new_empty(size) for _ in shards]
        self.comm.all_gather(gathered, mine)
        for r, s in enumerate(shards):
            if r != self.rank:
                copy_back(gathered[r], s)
        self.comm_log.append(("all_gather", size * like.element_size() * self.world_size))

    def _broadcast_shards(self, shards):
        # One broadcast per parameter, straight into it (torch's default): a flat buffer per
        # rank would cost a copy in and a copy out of every parameter, every step.
        # ---- exercise ShardedOptimizer: every parameter broadcast from the rank that owns it
        works = []
        for r, s in enumerate(shards):
            for p in s:
                if self.comm is dist and p.is_contiguous():  # all in flight at once
                    works.append(dist.broadcast(p, src=r, async_op=True))
                else:
                    flat = p.contiguous()  # p itself when contiguous
                    self.comm.broadcast(flat, src=r)
                    if flat is not p:
                        p.copy_(flat)
                self.comm_log.append(("broadcast", p.numel() * p.element_size()))
        for work in works:
            work.wait()
        # ---- end of exercise

    def bytes_per_step(self):
        """Bytes this rank sent in the last step, on average (wire_bytes of each collective)."""
        return sum(wire_bytes(c, n, self.world_size) for c, n in self.comm_log)

    # ---- checkpoints ----------------------------------------------------------------------

    def _global_index(self):
        """Parameter -> its position in the plain optimizer's state_dict (over all groups)."""
        params = [p for g in self.param_groups for p in g["params"]]
        return {id(p): i for i, p in enumerate(params)}

    def consolidate_state_dict(self, to=0):
        """Gather every rank's shard of the state on rank `to` (a collective: every rank calls
        it), so that state_dict() there returns the whole state. torch's name and semantics."""
        _check_rank(to, self.world_size)
        part, groups = self._local_state()
        parts = [None] * self.world_size if self.rank == to else None
        dist.gather_object(part, parts, dst=to)  # rare and small next to training: torch's is fine
        if self.rank == to:
            state = dict(sorted(((k, v) for p in parts for k, v in p.items()),
                                key=lambda kv: kv[0]))
            self._consolidated = (to, {"state": state, "param_groups": groups})
        else:
            self._consolidated = (to, None)

    def state_dict(self):
        """The plain optimizer's state_dict, on the rank consolidate_state_dict(to=r) gathered
        it to, until the next step(). State tensors come back on the CPU, as a checkpoint
        holds them; load_state_dict moves them to the parameters' device.

        Without consolidating first it raises at once, on any rank (as torch's does): the
        state is spread over the ranks, and gathering it here would be a collective that
        the usual `if rank == 0: save(opt.state_dict())` calls on one rank only, a hang.
        """
        if self._consolidated is None or self._consolidated[1] is None:
            where = ("" if self._consolidated is None else
                     f" (it was consolidated to rank {self._consolidated[0]}, this is rank "
                     f"{self.rank})")
            raise RuntimeError(
                "ShardedOptimizer.state_dict(): each rank holds only its shard of the state"
                f"{where}; call opt.consolidate_state_dict(to=0) on every rank first, then "
                "opt.state_dict() on rank 0 (torch's ZeroRedundancyOptimizer idiom); the "
                "consolidated copy lasts until the next step()")
        return self._consolidated[1]

    def _local_state(self):
        """This rank's state entries under their plain-layout positions, and param_groups."""
        index, local = self._global_index(), self.optim.state_dict()
        mine = [p for g in self.optim.param_groups for p in g["params"]]
        part = {index[id(p)]: {k: v.cpu() if torch.is_tensor(v) else v
                               for k, v in local["state"][i].items()}
                for i, p in enumerate(mine) if i in local["state"]}
        groups = [{**{k: v for k, v in g.items() if k != "params"},
                   "params": [index[id(p)] for p in g["params"]]} for g in self.param_groups]
        return part, groups

    def load_state_dict(self, state_dict):
        """Load a consolidated (plain optimizer's) state_dict: each rank keeps its shard's."""
        saved = state_dict["param_groups"]
        if len(saved) != len(self.param_groups) or any(
                len(s["params"]) != len(g["params"]) for s, g in zip(saved, self.param_groups)):
            raise ValueError("the state_dict's parameter groups do not match this optimizer's "
                             "(number of groups, or parameters per group)")
        # Saved positions are the plain optimizer's: map ours onto them group by group.
        to_saved = {id(p): i for g, s in zip(self.param_groups, saved)
                    for p, i in zip(g["params"], s["params"])}
        for group, s in zip(self.param_groups, saved):
            group.update({k: v for k, v in s.items() if k != "params"})
        local_state, local_groups, i = {}, [], 0
        for group, local in zip(self.param_groups, self.optim.param_groups):
            ids = []
            for p in local["params"]:
                if to_saved[id(p)] in state_dict["state"]:
                    local_state[i] = state_dict["state"][to_saved[id(p)]]
                ids.append(i)
                i += 1
            options = {k: v for k, v in group.items() if k != "params"}
            local_groups.append({**options, "params": ids})
        self.optim.load_state_dict({"state": local_state, "param_groups": local_groups})
        self.state = self.optim.state
        self._consolidated = None


def _check_rank(to, world_size):
    """A ValueError unless `to` is a rank (an int in 0..world_size-1)."""
    if isinstance(to, bool) or not isinstance(to, int) or not 0 <= to < world_size:
        raise ValueError(f"to must be a rank in 0..{world_size - 1}, got {to!r}")


# DIST_SGD_MINE: a learner's version replaces this one
swap_in(globals(), "ShardedOptimizer", ("ShardedOptimizer",), lesson="13")
