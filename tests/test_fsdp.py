"""FullyShardedDataParallel (ZeRO-2 and ZeRO-3) against one process and torch's fully_shard.

One launch per world size (2 and 3) runs every check; each rank returns what it saw and the
small tests below compare it with torch.testing.assert_close. The models have sizes that do
not divide by the world size (every piece padded), a LayerNorm, a bias-free layer, and (the
second one) a tied embedding / output weight and a frozen weight. float32 throughout, except
the compute_dtype=float16 check.
"""
import copy
import itertools

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

from dist_sgd.comm.counted import Counted, wire_bytes
from dist_sgd.ddp.ddp import DistributedDataParallel
from dist_sgd.plumbing.launch import launch
from dist_sgd.sgd.optim import SGD
from dist_sgd.shard.fsdp import FullyShardedDataParallel
from dist_sgd.shard.fsdp_io import full_optim_state_dict, load_full_optim_state_dict

STEPS, BATCH = 3, 4  # per rank
OPTIMIZERS = {"SGD momentum": (torch.optim.SGD, {"lr": 0.05, "momentum": 0.9}),
              "Adam": (torch.optim.Adam, {"lr": 0.01}),
              "AdamW": (torch.optim.AdamW, {"lr": 0.01, "weight_decay": 0.1}),
              "our SGD": (SGD, {"lr": 0.05, "momentum": 0.9, "nesterov": True})}
MODES = {"ZeRO-3": True, "ZeRO-2": False}  # reshard_after_forward
VARIANTS = {"torch collectives": {}, "our collectives": {"collectives": "ours"},
            "shard_all": {"shard_all": True}, "no prefetch": {"prefetch": 0},
            "prefetch 2": {"prefetch": 2}}


class Dense(nn.Module):
    """7 -> 13 -> LayerNorm -> 5 (no bias) -> 3: weights of 91, 65, 15 elements."""

    def __init__(self):
        super().__init__()
        self.fc1, self.norm = nn.Linear(7, 13), nn.LayerNorm(13)
        self.fc2, self.head = nn.Linear(13, 5, bias=False), nn.Linear(5, 3)

    def forward(self, x):
        return self.head(torch.tanh(self.fc2(torch.tanh(self.norm(self.fc1(x))))))


class Tied(nn.Module):
    """Embedding(11, 6) whose weight is also the output layer's; a frozen middle weight."""

    def __init__(self):
        super().__init__()
        self.embed, self.mid = nn.Embedding(11, 6), nn.Linear(6, 6)
        self.mid.weight.requires_grad_(False)
        self.out = nn.Linear(6, 11, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, tokens):
        return self.out(torch.tanh(self.mid(self.embed(tokens))))


MODELS = {"Dense": Dense, "Tied": Tied}


def make(name):
    torch.manual_seed(0)
    return MODELS[name]()


def batch(name, step, world_size):
    """Every rank's batch of this step, stacked: rank r's is [r * BATCH:(r + 1) * BATCH]."""
    g = torch.Generator().manual_seed(100 + step)
    n = BATCH * world_size
    if name == "Tied":
        return torch.randint(0, 11, (n,), generator=g), torch.randint(0, 11, (n,), generator=g)
    return torch.randn(n, 7, generator=g), torch.randn(n, 3, generator=g)


def loss_of(name, out, y):
    return F.cross_entropy(out.float(), y) if name == "Tied" else F.mse_loss(out.float(), y)


def mine(t, rank):
    return t[rank * BATCH:(rank + 1) * BATCH]


def train(rank, world_size, name, opt_name, steps=STEPS, **kwargs):
    """Ours and one process on the global batch, step by step: (ours full, reference) lists."""
    cls, okw = OPTIMIZERS[opt_name]
    ref, model = make(name), FullyShardedDataParallel(make(name), **kwargs)
    ref_opt, opt = cls(ref.parameters(), **okw), cls(model.parameters(), **okw)
    got, want = [], []
    for step in range(steps):
        x, y = batch(name, step, world_size)
        ref_opt.zero_grad()
        loss_of(name, ref(x), y).backward()
        ref_opt.step()
        opt.zero_grad()
        loss_of(name, model(mine(x, rank)), mine(y, rank)).backward()
        opt.step()
        got.append(model.gather_full_params())
        want.append({n: p.detach().clone() for n, p in ref.named_parameters()})
    return {"got": got, "want": want, "model": model, "opt": opt, "ref": ref, "ref_opt": ref_opt}


# torch's optimizers on the dense model, SGD and Adam on the tied one, our SGD once; every
# variant of the wrapper with Adam.
CONFIGS = ([(m, mode, o) for m in MODELS for mode in MODES for o in OPTIMIZERS
            if o != "our SGD" and (m == "Dense" or o != "AdamW")]
           + [("Dense", "ZeRO-3", "our SGD")] + [("Dense", "ZeRO-3", v) for v in VARIANTS])


def params_checks(rank, world_size):
    out = {}
    for name, mode, opt_name in CONFIGS[:-len(VARIANTS)]:
        r = train(rank, world_size, name, opt_name, reshard_after_forward=MODES[mode])
        out[name, mode, opt_name] = (r["got"], r["want"])
    for variant, kwargs in VARIANTS.items():
        r = train(rank, world_size, "Dense", "Adam", **kwargs)
        out["Dense", "ZeRO-3", variant] = (r["got"], r["want"])
    return out


def float16_check(rank, world_size):
    """compute_dtype=float16 against one process that casts the same way (SGD)."""
    ref, model = make("Dense"), FullyShardedDataParallel(make("Dense"), compute_dtype=torch.float16)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    got, want = [], []
    for step in range(STEPS):
        x, y = batch("Dense", step, world_size)
        half = copy.deepcopy(ref).half()  # the cast copy computes; ref keeps float32 masters
        loss_of("Dense", half(x.half()), y).backward()
        for p, h in zip(ref.parameters(), half.parameters()):
            p.grad = h.grad.float()
        ref_opt.step()
        opt.zero_grad()
        loss_of("Dense", model(mine(x, rank)), mine(y, rank)).backward()
        opt.step()
        got.append(model.gather_full_params())
        want.append({n: p.detach().clone() for n, p in ref.named_parameters()})
    dtypes = sorted({str(t.dtype) for t in [*model.parameters(), *(p.grad for p in model.parameters())]
                     + [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]})
    gathers = [n for kind, n in model.comm.log if kind == "all_gather"]
    return {"got": got, "want": want, "dtypes": dtypes, "gather_bytes": gathers}


TORCH_CONFIGS = {("ZeRO-3", False): "Adam", ("ZeRO-3", True): "SGD momentum",
                 ("ZeRO-2", False): "SGD momentum", ("ZeRO-2", True): "Adam"}


def against_torch(rank, world_size):
    """torch's fully_shard (every parameter-owning module and the root) and ours, same start,
    same per-rank data: full parameters after every step (SGD sees a gradient's scale, Adam
    hardly)."""
    out = {}
    for (mode, shard_all), opt_name in TORCH_CONFIGS.items():
        reshard = MODES[mode]
        ours = FullyShardedDataParallel(make("Dense"), reshard_after_forward=reshard,
                                        shard_all=shard_all)
        theirs = make("Dense")
        for m in theirs.modules():
            if m is not theirs and list(m.parameters(recurse=False)):
                fully_shard(m, reshard_after_forward=reshard)
        fully_shard(theirs, reshard_after_forward=reshard)
        cls, okw = OPTIMIZERS[opt_name]
        opts = [cls(m.parameters(), **okw) for m in (ours, theirs)]
        history = []
        for step in range(STEPS):
            x, y = batch("Dense", step, world_size)
            for m, o in zip((ours, theirs), opts):
                o.zero_grad()
                loss_of("Dense", m(mine(x, rank)), mine(y, rank)).backward()
                o.step()
            history.append((ours.gather_full_params(),
                            {n: p.full_tensor() for n, p in theirs.named_parameters()}))
        out[mode, shard_all] = history
    return out


def holdings(rank, world_size):
    """What each rank holds after an Adam step: pieces, their gradients and Adam's state."""
    r = train(rank, world_size, "Dense", "Adam", steps=1)
    model, opt = r["model"], r["opt"]
    sharded = {n: s for n, s in model.shards_by_name.items()}
    out = {"sizes": {}, "pieces": {}, "numel": {}, "replicated_grads": {}}
    for n, s in sharded.items():
        state = opt.state[s.param]
        out["sizes"][n] = [s.param.numel(), s.param.grad.numel(), state["exp_avg"].numel(),
                           state["exp_avg_sq"].numel()]
        out["pieces"][n] = [s.param.detach().clone(), s.param.grad.clone(),
                            state["exp_avg"].clone(), state["exp_avg_sq"].clone()]
        out["numel"][n] = s.numel
    ref_state = {n: r["ref_opt"].state[p] for n, p in r["ref"].named_parameters()}
    out["full"] = {n: [r["ref"].get_parameter(n).detach(), r["ref"].get_parameter(n).grad,
                       ref_state[n]["exp_avg"], ref_state[n]["exp_avg_sq"]] for n in sharded}
    out["replicated_grads"] = {n: p.grad.clone() for n, p in model.module.named_parameters()
                               if n not in sharded}
    out["dtypes"] = sorted({str(p.dtype) for p in model.parameters()})
    return out


def accumulation(rank, world_size):
    """Two micro-batches, the first under no_sync, equal one process on both global ones."""
    out = {}
    for mode, reshard in MODES.items():
        ref, model = make("Dense"), FullyShardedDataParallel(make("Dense"), reshard_after_forward=reshard)
        (x1, y1), (x2, y2) = batch("Dense", 0, world_size), batch("Dense", 1, world_size)
        (loss_of("Dense", ref(x1), y1) + loss_of("Dense", ref(x2), y2)).backward()
        with model.no_sync():
            loss_of("Dense", model(mine(x1, rank)), mine(y1, rank)).backward()
        no_sync_bytes = model.bytes_per_step()
        loss_of("Dense", model(mine(x2, rank)), mine(y2, rank)).backward()
        grads = {n: p.grad.clone() for n, p in model.module.named_parameters()}
        gathered = {}
        for n, s in model.shards_by_name.items():  # every rank's gradient piece -> the whole
            pieces = [torch.empty_like(s.param) for _ in range(world_size)]
            dist.all_gather(pieces, s.param.grad)
            gathered[n] = torch.cat(pieces)[:s.numel].view(s.shape)
        grads.update(gathered)
        out[mode] = {"got": grads, "want": {n: p.grad.clone() for n, p in ref.named_parameters()},
                     "no_sync_gather_only": no_sync_bytes}
    return out


def checkpoints(rank, world_size):
    r = train(rank, world_size, "Dense", "Adam")
    model, opt, ref, ref_opt = r["model"], r["opt"], r["ref"], r["ref_opt"]
    full, ref_sd = model.state_dict(), copy.deepcopy(ref.state_dict())
    plain = make("Dense")
    plain.load_state_dict(full)  # into the unwrapped module
    optim, ref_optim = full_optim_state_dict(model, opt), copy.deepcopy(ref_opt.state_dict())
    plain_opt = torch.optim.Adam(plain.parameters(), lr=0.01)
    plain_opt.load_state_dict(copy.deepcopy(optim))
    back = FullyShardedDataParallel(make("Dense"))  # a fresh start, then the checkpoint
    back.load_state_dict(full)
    back_opt = torch.optim.Adam(back.parameters(), lr=0.01)
    load_full_optim_state_dict(back, back_opt, copy.deepcopy(ref_optim))
    after = []
    for step in range(STEPS, STEPS + 2):
        x, y = batch("Dense", step, world_size)
        for m, o, data in ((ref, ref_opt, (x, y)), (plain, plain_opt, (x, y)),
                           (back, back_opt, (mine(x, rank), mine(y, rank)))):
            o.zero_grad()
            loss_of("Dense", m(data[0]), data[1]).backward()
            o.step()
        after.append((back.gather_full_params(), {n: p.detach().clone() for n, p in ref.named_parameters()},
                      {n: p.detach().clone() for n, p in plain.named_parameters()}))
    return {"full": full, "ref_sd": ref_sd, "optim": optim, "ref_optim": ref_optim, "after": after}


def errors(rank, world_size):
    """Bad input: each gets a clear error, on every rank, and leaves the model as it was."""
    out = {}

    def catch(key, fn):
        try:
            fn()
            out[key] = None
        except Exception as e:  # noqa: BLE001
            out[key] = (type(e).__name__, str(e))

    catch("no parameters", lambda: FullyShardedDataParallel(nn.Tanh()))
    plain = make("Dense")
    early = torch.optim.SGD(plain.parameters(), lr=0.1)  # built before wrapping: stale
    model = FullyShardedDataParallel(plain)
    catch("twice", lambda: FullyShardedDataParallel(plain))
    x, y = batch("Dense", 0, world_size)
    loss_of("Dense", model(mine(x, rank)), mine(y, rank)).backward()
    catch("stale optimizer", early.step)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    opt.step()
    before = {n: p.detach().clone() for n, p in model.module.named_parameters()}
    pieces = {n: t.clone() for n, t in model.module.state_dict().items()}  # one rank's pieces
    other = {n: torch.zeros(-(-t.numel() // (world_size + 1))) if n in model.shards_by_name else t
             for n, t in model.state_dict().items()}  # as if saved at world size p + 1
    catch("pieces as state_dict", lambda: model.load_state_dict(pieces))
    catch("other world size", lambda: model.load_state_dict(other))
    catch("pieces as optimizer state", lambda: load_full_optim_state_dict(model, opt, opt.state_dict()))
    out["untouched"] = all(torch.equal(before[n], p) for n, p in model.module.named_parameters())
    catch("units not submodules", lambda: FullyShardedDataParallel(make("Dense"),
                                                                   units=[nn.Linear(2, 2)]))
    return out


def bytes_and_memory(rank, world_size):
    """Counted bytes per step of DDP, ZeRO-2, ZeRO-3 on a model whose sizes divide by 2 and 3
    (no padding), every parameter sharded; memory peaks; which gathers prefetch started."""
    def stack():
        torch.manual_seed(0)
        return nn.Sequential(*[nn.Linear(12, 12, bias=False) for _ in range(4)])

    x = torch.randn(BATCH, 12)
    counted = Counted("torch")
    ddp = DistributedDataParallel(stack(), all_reduce=lambda t: counted.start("all_reduce", t).wait())
    ddp(x).sum().backward()
    out = {"DDP": counted.bytes_sent(world_size), "unit": 12 * 12 * 4}
    for mode, reshard in MODES.items():
        for prefetch in (0, 1):
            model = FullyShardedDataParallel(stack(), reshard_after_forward=reshard, shard_all=True,
                                             prefetch=prefetch)
            issued = []  # gathers issued when each unit starts computing
            for m in model.module:
                m.register_forward_pre_hook(
                    lambda *_: issued.append(sum(k == "all_gather" for k, _ in model.comm.log)))
            for _ in range(2):  # the second step has the order of the first
                issued.clear()
                y = model(x)
                after_forward = model.memory()["buffers"]  # the units kept for backward
                y.sum().backward()
            out[mode, prefetch] = {"bytes": model.bytes_per_step(), "memory": model.memory(),
                                   "issued": list(issued), "log": list(model.comm.log),
                                   "after_forward": after_forward}
    ddp.remove_hooks()
    return out


def kept_against_torch_ddp(rank, world_size):
    """ZeRO-3 keeping its last units gathered from forward to backward (from the second step
    on), every prefetch, against torch's DDP on the same per-rank data: full weights."""
    out = {}
    for prefetch in (0, 1, 2):
        ours = FullyShardedDataParallel(make("Dense"), prefetch=prefetch)
        theirs = nn.parallel.DistributedDataParallel(make("Dense"))
        opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (ours, theirs)]
        for step in range(STEPS):
            x, y = batch("Dense", step, world_size)
            for m, o in zip((ours, theirs), opts):
                o.zero_grad()
                loss_of("Dense", m(mine(x, rank)), mine(y, rank)).backward()
                o.step()
        out[prefetch] = (ours.gather_full_params(),
                         {n: p.detach().clone() for n, p in theirs.module.named_parameters()})
    return out


# ---- edges: each against torch's fully_shard on the same model and per-rank data ------------

class Checkpointed(Dense):
    """fc2 under activation checkpointing: its forward runs again in backward (to its end
    when early_stop is False, post-forward hooks included)."""

    early_stop = True

    def forward(self, x):
        h = torch.tanh(self.norm(self.fc1(x)))
        with set_checkpoint_early_stop(self.early_stop):
            h = checkpoint(self.fc2, h, use_reentrant=False)
        return self.head(torch.tanh(h))


class CheckpointedToTheEnd(Checkpointed):
    early_stop = False


class Logged(Dense):
    """A second head whose output is only kept for logging: it never gets a gradient."""

    def __init__(self):
        super().__init__()
        self.aux = nn.Linear(5, 2)

    def forward(self, x):
        h = torch.tanh(self.fc2(torch.tanh(self.norm(self.fc1(x)))))
        self.logged = self.aux(h).detach()
        return self.head(h)


class Offset(Dense):
    """A float32 buffer added to fc1's input: under bfloat16 compute its input is float32."""

    def __init__(self):
        super().__init__()
        self.register_buffer("offset", torch.linspace(-0.5, 0.5, 7))

    def forward(self, x):
        return super().forward(x + self.offset)


class TiedOutside(nn.Module):
    """The embedding's weight used again by the root itself (not in a module's forward)."""

    def __init__(self):
        super().__init__()
        self.embed, self.mid = nn.Embedding(11, 6), nn.Linear(6, 6)

    def forward(self, tokens):
        return F.linear(torch.tanh(self.mid(self.embed(tokens))), self.embed.weight)


def seeded(cls):
    torch.manual_seed(0)
    return cls()


def torch_sharded(model, inner=None, **kwargs):
    """fully_shard on every parameter-owning submodule (or on `inner`), then on the root."""
    inner = [m for m in model.modules() if m is not model and list(m.parameters(recurse=False))
             ] if inner is None else inner
    for m in inner:
        fully_shard(m, **kwargs)
    return fully_shard(model, **kwargs)


def full_grads(model):
    """Ours: {name: the full gradient} (pieces gathered); None where there is none."""
    out = {}
    for n, p in model.module.named_parameters():
        s = model.shards_by_name.get(n)
        if s is None or p.grad is None:
            out[n] = None if p.grad is None else p.grad.clone()
            continue
        pieces = [torch.empty_like(p.grad) for _ in range(dist.get_world_size())]
        dist.all_gather(pieces, p.grad)
        out[n] = torch.cat(pieces)[:s.numel].view(s.shape)
    return out


def torch_grads(model):
    return {n: None if p.grad is None else p.grad.full_tensor()
            for n, p in model.named_parameters()}


def side_by_side(rank, world_size, ours, theirs, name="Dense", steps=STEPS, dtype=None):
    """SGD steps on both; every step: (ours full params, torch's), (ours grads, torch's)."""
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (ours, theirs)]
    history = []
    for step in range(steps):
        x, y = batch(name, step, world_size)
        for m, o in zip((ours, theirs), opts):
            o.zero_grad()
            loss_of(name, m(mine(x, rank)), mine(y, rank)).backward()
        grads = (full_grads(ours), torch_grads(theirs))
        for o in opts:
            o.step()
        history.append(((ours.gather_full_params(),
                         {n: p.full_tensor() for n, p in theirs.named_parameters()}), grads))
    return history


def edges(rank, world_size):
    out = {}
    for mode, reshard in MODES.items():
        for cls in (Checkpointed, CheckpointedToTheEnd):
            out[cls.__name__, mode] = side_by_side(
                rank, world_size,
                FullyShardedDataParallel(seeded(cls), reshard_after_forward=reshard),
                torch_sharded(seeded(cls), reshard_after_forward=reshard))
    out["logged"] = side_by_side(rank, world_size, FullyShardedDataParallel(seeded(Logged)),
                                 torch_sharded(seeded(Logged)))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    out["bfloat16 buffer"] = side_by_side(
        rank, world_size, FullyShardedDataParallel(seeded(Offset), compute_dtype=torch.bfloat16),
        torch_sharded(seeded(Offset), mp_policy=policy))
    out["tied outside"] = side_by_side(
        rank, world_size, FullyShardedDataParallel(seeded(TiedOutside), units=[]),
        torch_sharded(seeded(TiedOutside), inner=[]), name="Tied")
    wrapped = FullyShardedDataParallel(seeded(TiedOutside))  # the default wrap: embed a unit
    try:
        wrapped(batch("Tied", 0, world_size)[0][rank * BATCH:(rank + 1) * BATCH])
        out["tied outside, default wrap"] = None
    except ValueError as error:
        out["tied outside, default wrap"] = str(error)
    ours, theirs = seeded(Dense), seeded(Dense)  # units as torch's calls: fc1, then the root
    out["units chosen"] = side_by_side(
        rank, world_size, FullyShardedDataParallel(ours, units=[ours.fc1]),
        torch_sharded(theirs, inner=[theirs.fc1]))
    out["no_sync, zero_grad, synced"] = no_sync_then_zero_grad(rank, world_size)
    out["clip"] = clipped(rank, world_size)
    return out


def no_sync_then_zero_grad(rank, world_size):
    """A backward under no_sync, opt.zero_grad(), a synchronized one: the gradients."""
    ours, theirs = FullyShardedDataParallel(seeded(Dense)), torch_sharded(seeded(Dense))
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (ours, theirs)]
    (x1, y1), (x2, y2) = batch("Dense", 0, world_size), batch("Dense", 1, world_size)
    with ours.no_sync():
        loss_of("Dense", ours(mine(x1, rank)), mine(y1, rank)).backward()
    theirs.set_requires_gradient_sync(False)
    loss_of("Dense", theirs(mine(x1, rank)), mine(y1, rank)).backward()
    theirs.set_requires_gradient_sync(True)
    for o in opts:
        o.zero_grad()
    for m in (ours, theirs):
        loss_of("Dense", m(mine(x2, rank)), mine(y2, rank)).backward()
    return full_grads(ours), torch_grads(theirs)


def clipped(rank, world_size):
    """clip_grad_norm_ of ours against torch.nn.utils.clip_grad_norm_ on fully_shard's DTensor
    parameters (the global norm), 2-norm and max-norm; then one SGD step."""
    out = {}
    for norm_type, shard_all in itertools.product((2.0, float("inf")), (False, True)):
        ours = FullyShardedDataParallel(seeded(Dense), shard_all=shard_all)
        theirs = torch_sharded(seeded(Dense))
        opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (ours, theirs)]
        x, y = batch("Dense", 0, world_size)
        for m in (ours, theirs):
            loss_of("Dense", m(mine(x, rank)), mine(y, rank)).backward()
        norms = (ours.clip_grad_norm_(0.5, norm_type),
                 torch.nn.utils.clip_grad_norm_(theirs.parameters(), 0.5, norm_type).full_tensor())
        grads = (full_grads(ours), torch_grads(theirs))
        for o in opts:
            o.step()
        out[norm_type, shard_all] = {"norms": norms, "grads": grads, "params": (
            ours.gather_full_params(), {n: p.full_tensor() for n, p in theirs.named_parameters()})}
    return out


def worker(rank, world_size):
    results = {"params": params_checks(rank, world_size), "float16": float16_check(rank, world_size),
               "torch": against_torch(rank, world_size), "holdings": holdings(rank, world_size),
               "accumulation": accumulation(rank, world_size),
               "checkpoints": checkpoints(rank, world_size), "errors": errors(rank, world_size),
               "bytes": bytes_and_memory(rank, world_size), "edges": edges(rank, world_size),
               "kept": kept_against_torch_ddp(rank, world_size)}
    dist.barrier()  # our DDP's reducer done everywhere before the group goes
    return results


@pytest.fixture(scope="module", params=[2, 3], ids=lambda p: f"p{p}")
def runs(request):
    return request.param, launch(worker, request.param, backend="gloo")


def one_rank(rank, world_size):
    """World size 1: the pieces are the whole parameters; everything still works."""
    out = {name: train(rank, world_size, "Dense", "Adam", reshard_after_forward=reshard)
           for name, reshard in MODES.items()}
    model = out["ZeRO-3"]["model"]
    plain = make("Dense")
    plain.load_state_dict(model.state_dict())
    return {"params": {k: (r["got"], r["want"]) for k, r in out.items()},
            "sizes": [p.numel() for p in model.parameters()], "sent": model.bytes_per_step(),
            "plain": {n: p.detach().clone() for n, p in plain.named_parameters()}}


@pytest.fixture(scope="module")
def alone():
    return launch(one_rank, 1, backend="gloo")[0]


def close(got, want, **tol):
    assert sorted(got) == sorted(want)
    for n in want:
        torch.testing.assert_close(got[n], want[n], msg=lambda m, n=n: f"{n}: {m}", **tol)


# ---- the tests ------------------------------------------------------------------------------



@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(c).replace(" ", "_"))
def test_full_parameters_equal_one_process_after_every_step(runs, config):
    _, results = runs
    for r in results:
        for step, (got, want) in enumerate(zip(*r["params"][config])):
            close(got, want, atol=1e-6, rtol=1e-5)


def test_float16_compute_equals_one_process_that_casts_the_same_way(runs):
    _, results = runs
    for r in results:
        for got, want in zip(r["float16"]["got"], r["float16"]["want"]):
            close(got, want, atol=2e-3, rtol=0)
        assert r["float16"]["dtypes"] == ["torch.float32"]  # pieces, grads, Adam... all float32


def test_float16_gathers_half_the_bytes(runs):
    p, results = runs
    sizes = [-(-n // p) * p * 2 for n in (7 * 13, 13 * 5, 5 * 3)]  # float16: 2 bytes
    assert results[0]["float16"]["gather_bytes"][:3] == sizes


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shard_all", [False, True], ids=["2d_sharded", "all_sharded"])
def test_equal_to_torch_fully_shard_step_for_step(runs, mode, shard_all):
    _, results = runs
    for r in results:
        for ours, theirs in r["torch"][mode, shard_all]:
            close(ours, theirs, atol=1e-6, rtol=1e-5)


def test_each_rank_holds_its_piece_of_every_sharded_tensor_and_together_all(runs):
    p, results = runs
    for name, numel in results[0]["holdings"]["numel"].items():
        for r in results:  # parameter, gradient, exp_avg, exp_avg_sq: ceil(n / p) each
            assert r["holdings"]["sizes"][name] == [-(-numel // p)] * 4, name
            assert r["holdings"]["dtypes"] == ["torch.float32"]
        for k in range(4):  # the ranks' pieces, end to end, are the one process's tensors
            whole = torch.cat([r["holdings"]["pieces"][name][k] for r in results])
            torch.testing.assert_close(whole[:numel].view_as(results[0]["holdings"]["full"][name][k]),
                                       results[0]["holdings"]["full"][name][k], atol=1e-6, rtol=1e-5)
            assert torch.count_nonzero(whole[numel:]) == 0, f"{name}: the padding is not zero"


def test_replicated_gradients_are_identical_on_every_rank(runs):
    _, results = runs
    first = results[0]["holdings"]["replicated_grads"]
    assert sorted(first) == ["fc1.bias", "head.bias", "norm.bias", "norm.weight"]
    for r in results[1:]:
        close(r["holdings"]["replicated_grads"], first, atol=0, rtol=0)


@pytest.mark.parametrize("mode", MODES)
def test_no_sync_accumulation_equals_one_large_batch(runs, mode):
    p, results = runs
    for r in results:
        close(r["accumulation"][mode]["got"], r["accumulation"][mode]["want"], atol=1e-6, rtol=1e-5)
    # Under no_sync nothing but the gathers went out: no reduce-scatter, no all-reduce.
    gathered = sum(-(-n // p) * p * 4 for n in (7 * 13, 13 * 5, 5 * 3)) * (p - 1) / p
    expected = gathered * (2 if mode == "ZeRO-3" else 1)
    assert results[0]["accumulation"][mode]["no_sync_gather_only"] == pytest.approx(expected)


def test_state_dict_is_the_plain_modules_and_round_trips(runs):
    _, results = runs
    for r in results:
        c = r["checkpoints"]
        close(c["full"], c["ref_sd"], atol=1e-6, rtol=1e-5)
        for back, ref, plain in c["after"]:  # loaded into a fresh FSDP and into the plain module
            close(back, ref, atol=1e-6, rtol=1e-5)
            close(plain, ref, atol=1e-6, rtol=1e-5)


def test_full_optimizer_state_is_the_plain_optimizers(runs):
    _, results = runs
    for r in results:
        got, want = r["checkpoints"]["optim"], r["checkpoints"]["ref_optim"]
        assert got["param_groups"] == want["param_groups"]
        assert sorted(got["state"]) == sorted(want["state"])
        for i in want["state"]:
            close(got["state"][i], want["state"][i], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("case, kind, words", [
    ("no parameters", "ValueError", "no parameters"),
    ("twice", "ValueError", "already"),
    ("stale optimizer", "RuntimeError", "before"),
    ("pieces as state_dict", "ValueError", "one rank's piece"),
    ("other world size", "ValueError", "world size"),
    ("pieces as optimizer state", "ValueError", "one rank's piece"),
    ("units not submodules", "ValueError", "submodules"),
])
def test_bad_input_gets_a_clear_error_on_every_rank(runs, case, kind, words):
    _, results = runs
    for r in results:
        assert r["errors"][case] is not None, f"{case}: no error"
        assert r["errors"][case][0] == kind and words in r["errors"][case][1], r["errors"][case]
        assert r["errors"]["untouched"], "a refused checkpoint changed the model"


def test_zero3_sends_1_5x_less_the_kept_units_and_zero2_1_0x_ddps_counted_bytes(runs):
    """Four equal units: DDP all-reduces 4 (2 units' worth of bytes each), ZeRO-3 gathers 4 in
    forward, 4 less the 1 + prefetch kept in backward, and reduce-scatters 4."""
    _, results = runs
    b = results[0]["bytes"]
    for prefetch in (0, 1):
        kept = 1 + prefetch
        assert b["ZeRO-3", prefetch]["bytes"] == pytest.approx((12 - kept) / 8 * b["DDP"],
                                                               rel=1e-12)
        assert b["ZeRO-2", prefetch]["bytes"] == pytest.approx(1.0 * b["DDP"], rel=1e-12)
    # Forward: 4 gathers; backward: the last two units kept (prefetch 1), the next gathered
    # ahead, each unit's reduce-scatter as soon as its gradient is there.
    kinds = [k[0] + k[-1] for k, _ in b["ZeRO-3", 1]["log"]]  # "ar": all_gather, "rr": reduce
    assert kinds == ["ar"] * 4 + ["rr", "ar", "rr", "ar", "rr", "rr"]
    kinds = [k[0] + k[-1] for k, _ in b["ZeRO-3", 0]["log"]]  # the last unit kept only
    assert kinds == ["ar"] * 4 + ["rr", "ar", "rr", "ar", "rr", "ar", "rr"]


def test_prefetch_starts_the_next_gather_before_the_unit_computes(runs):
    _, results = runs
    b = results[0]["bytes"]
    assert b["ZeRO-3", 0]["issued"] == [1, 2, 3, 4]  # each unit's own gather only
    assert b["ZeRO-3", 1]["issued"] == [2, 3, 4, 4]  # and the next one's


def test_peak_memory_is_the_units_alive_at_once(runs):
    """prefetch 0: one unit gathered + one unit's gradient being reduced; prefetch 1: two
    units gathered; ZeRO-2 keeps all four units from forward to backward."""
    _, results = runs
    b = results[0]["bytes"]
    unit = b["unit"]  # 12 x 12 float32, divisible: no padding
    assert b["ZeRO-3", 0]["memory"]["peak_buffers"] == 2 * unit
    assert b["ZeRO-3", 1]["memory"]["peak_buffers"] == 3 * unit
    assert b["ZeRO-2", 1]["memory"]["peak_buffers"] == 4 * unit
    for key in b:
        if isinstance(key, tuple):
            assert b[key]["memory"]["buffers"] == 0  # nothing left gathered after a step


def test_zero3_keeps_the_units_that_finish_forward_last_within_the_peak(runs):
    """After forward ZeRO-3 holds the last unit and the `prefetch` before it (the ones its
    backward needs first), no more than it holds at once anyway; ZeRO-2 holds them all."""
    _, results = runs
    b = results[0]["bytes"]
    for prefetch in (0, 1):
        assert b["ZeRO-3", prefetch]["after_forward"] == (1 + prefetch) * b["unit"]
        assert b["ZeRO-3", prefetch]["after_forward"] <= b["ZeRO-3", prefetch]["memory"][
            "peak_buffers"]
    assert b["ZeRO-2", 1]["after_forward"] == 4 * b["unit"]


@pytest.mark.parametrize("prefetch", [0, 1, 2])
def test_zero3_keeping_units_equals_torch_ddp(runs, prefetch):
    for r in runs[1]:
        close(*r["kept"][prefetch], atol=1e-6, rtol=1e-5)


def test_world_size_1_equals_one_process_and_sends_nothing(alone):
    for got, want in zip(*alone["params"]["ZeRO-3"]):
        close(got, want, atol=1e-6, rtol=1e-5)
    for got, want in zip(*alone["params"]["ZeRO-2"]):
        close(got, want, atol=1e-6, rtol=1e-5)
    assert alone["sizes"] == [7 * 13, 13, 13, 13, 13 * 5, 5 * 3, 3]  # one piece: all of it
    assert alone["sent"] == 0
    close(alone["plain"], alone["params"]["ZeRO-3"][0][-1], atol=0, rtol=0)


# ---- edges: each against torch's fully_shard --------------------------------------------------

def close_or_none(got, want, **tol):
    assert sorted(got) == sorted(want)
    for n in want:
        assert (got[n] is None) == (want[n] is None), f"{n}: ours {got[n]}, torch's {want[n]}"
        if want[n] is not None:
            torch.testing.assert_close(got[n], want[n], msg=lambda m, n=n: f"{n}: {m}", **tol)


def same_history(history, **tol):
    for (params, grads) in history:
        close_or_none(*grads, **tol)
        close(*params, **tol)


@pytest.mark.parametrize("early_stop", [True, False], ids=["early_stop", "to_the_end"])
@pytest.mark.parametrize("mode", MODES)
def test_activation_checkpointing_equals_torch(runs, mode, early_stop):
    """The recompute in backward uses the gathered weights and frees nothing: backward
    still needs them."""
    name = "Checkpointed" if early_stop else "CheckpointedToTheEnd"
    for r in runs[1]:
        same_history(r["edges"][name, mode], atol=1e-6, rtol=1e-5)


def test_an_output_only_logged_leaves_its_gradients_none_as_torch(runs):
    for r in runs[1]:
        same_history(r["edges"]["logged"], atol=1e-6, rtol=1e-5)
        assert r["edges"]["logged"][0][1][0]["aux.weight"] is None


def test_bfloat16_casts_every_units_inputs_as_torch(runs):
    """A float32 buffer added inside: fc1's input is cast too, as each fully_shard module's."""
    for r in runs[1]:
        same_history(r["edges"]["bfloat16 buffer"], atol=1e-2, rtol=1e-2)


def test_root_only_unit_lets_the_root_use_a_weight_as_torch(runs):
    for r in runs[1]:
        same_history(r["edges"]["tied outside"], atol=1e-6, rtol=1e-5)


def test_a_weight_used_outside_its_units_forward_is_refused_by_name_pointing_at_units(runs):
    # The default wrap makes embed a unit: outside its forward embed.weight is a piece, and
    # F.linear(h, self.embed.weight) in the root's forward would fail on its shape.
    for r in runs[1]:
        error = r["edges"]["tied outside, default wrap"]
        assert error is not None, "no error"
        assert "embed.weight" in error and "units=" in error, error


def test_units_chosen_equal_torchs_fully_shard_calls(runs):
    for r in runs[1]:
        same_history(r["edges"]["units chosen"], atol=1e-6, rtol=1e-5)


def test_no_sync_gradients_survive_zero_grad_for_every_parameter_as_torch(runs):
    for r in runs[1]:
        close_or_none(*r["edges"]["no_sync, zero_grad, synced"], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("shard_all", [False, True], ids=["2d_sharded", "all_sharded"])
@pytest.mark.parametrize("norm_type", [2.0, float("inf")], ids=["2norm", "maxnorm"])
def test_clip_grad_norm_is_global_as_torch_on_dtensors(runs, norm_type, shard_all):
    for r in runs[1]:
        c = r["edges"]["clip"][norm_type, shard_all]
        torch.testing.assert_close(c["norms"][0], c["norms"][1], atol=1e-6, rtol=1e-5)
        close_or_none(*c["grads"], atol=1e-6, rtol=1e-5)
        close(*c["params"], atol=1e-6, rtol=1e-5)
    first = runs[1][0]["edges"]["clip"][norm_type, shard_all]["grads"][0]
    for r in runs[1][1:]:  # replicated gradients stay identical across ranks
        close_or_none(r["edges"]["clip"][norm_type, shard_all]["grads"][0], first, atol=0, rtol=0)
