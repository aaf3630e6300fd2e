"""Pipeline parallelism: a model's layers split into stages, one per rank, joined by send/recv.

torch.distributed.pipelining's interface, so code written for it runs on ours:

    stage = PipelineStage(submodule, stage_index, num_stages, device, group=None)
    schedule = ScheduleGPipe(stage, n_microbatches, loss_fn)    # or Schedule1F1B(...)
    out = schedule.step(x)                                # first stage: the batch
    out = schedule.step(target=y, losses=losses)          # last stage: the targets, the losses
    schedule.step()                                       # every stage in between

step() is a plain loop over the schedule's order (`gpipe`, `one_f_one_b`: lists of ("F", i)
and ("B", i)), then divides the gradients by n_microbatches once (torch's scale_grads); the
loss exists on the last stage only. Each step is metered beside the loop (pipeline_meter.py):
`schedule.trace`, `peak_held`, `peak_bytes`. Unlike torch's: one tensor in and out of each
stage; a batch n_microbatches does not divide, a stage without parameters, missing inputs or
targets are refused on every stage before anything is sent. group= chooses the ranks the
stages are (a pipeline inside a 2-D mesh).
"""
import torch
import torch.distributed as dist

from dist_sgd.comm.collectives import all_gather
from dist_sgd.comm.wire import irecv, isend
from dist_sgd.parallel.pipeline_meter import Meter
from dist_sgd.plumbing.mine import swap_in
from dist_sgd.plumbing.rank import world

__all__ = ["PipelineStage", "ScheduleGPipe", "Schedule1F1B", "split_stages", "gpipe",
           "one_f_one_b"]

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64]
HEADER = 8  # int64s: dtype, ndim, up to 6 sizes; sent before a step's first activation


def split_stages(model, num_stages):
    """The layers of an nn.Sequential cut into num_stages contiguous runs, as equal as can be;
    a list of nn.Sequential. More stages than layers: ValueError."""
    layers = list(model)
    if not 1 <= num_stages <= len(layers):
        raise ValueError(f"cannot split {len(layers)} layers into {num_stages} stages: "
                         "every stage needs at least one layer")
    base, extra = divmod(len(layers), num_stages)
    cuts = [0]
    for s in range(num_stages):
        cuts.append(cuts[-1] + base + (s < extra))
    return [torch.nn.Sequential(*layers[cuts[s]:cuts[s + 1]]) for s in range(num_stages)]


class PipelineStage:
    """This rank's part of the model: stage `stage_index` of `num_stages`, the rank of that
    number in `group` (default: the whole world). Made on every stage at once (it checks,
    with one all-gather, that every stage has parameters)."""

    def __init__(self, submodule, stage_index, num_stages, device, group=None):
        rank, size = world("PipelineStage", group)
        if num_stages != size or stage_index != rank:
            raise ValueError(f"PipelineStage: stage_index {stage_index} of num_stages "
                             f"{num_stages} on rank {rank} of a group of {size}: run one stage "
                             "per rank, stage i on the group's rank i")
        self.submod, self.stage_index, self.num_stages = submodule, stage_index, num_stages
        self.device, self.group = torch.device(device), group
        self.ranks = dist.get_process_group_ranks(group) if group else list(range(size))
        counts = [torch.zeros(1, dtype=torch.int64, device=self.device) for _ in range(size)]
        mine = torch.tensor([sum(1 for _ in submodule.parameters())], device=self.device)
        all_gather(counts, mine, group=group)
        empty = [s for s, c in enumerate(counts) if c.item() == 0]
        if empty:
            raise ValueError(f"pipeline stage {empty[0]} has no parameters: give every stage "
                             "at least one layer with weights (move its layers to a neighbour)")
        self.is_first, self.is_last = stage_index == 0, stage_index == num_stages - 1

    def send(self, t, to):
        return isend(t.contiguous(), self.ranks[self.stage_index + to])  # wire: gloo + GPU

    def recv(self, t, frm):
        irecv(t, self.ranks[self.stage_index + frm]).wait()
        return t


def gpipe(stage_index, num_stages, n_microbatches):
    """GPipe: every forward, then every backward, in micro-batch order."""
    return [("F", i) for i in range(n_microbatches)] + [("B", i) for i in range(n_microbatches)]


def one_f_one_b(stage_index, num_stages, n_microbatches):
    """1F1B's order on one stage, a list of ("F", i) and ("B", i): p - 1 - stage_index warm-up
    forwards, then one forward and one backward while forwards remain, then the backwards left.

    Stage s holds at most p - s micro-batches: a backward frees one as each forward adds one.
    """
    # ---- exercise one_f_one_b: the warm-up forwards, then forward-backward pairs, then the rest
    warmup = min(num_stages - 1 - stage_index, n_microbatches)
    order = [("F", i) for i in range(warmup)]
    for i in range(n_microbatches - warmup):
        order += [("F", warmup + i), ("B", i)]
    return order + [("B", i) for i in range(n_microbatches - warmup, n_microbatches)]
    # ---- end of exercise


def last_stage_loss(loss_fn, output, target, n_microbatches):
    """The loss the last stage runs backward from, for one micro-batch. The schedule divides
    the gradients by n_microbatches once, at the end of the step (scale_grads)."""
    # ---- exercise one_f_one_b: the loss whose backward gives this micro-batch's share
    return loss_fn(output, target)
    # ---- end of exercise


class _Schedule:
    order = staticmethod(gpipe)
    loss = staticmethod(lambda *args: last_stage_loss(*args))  # looked up at each call

    def __init__(self, stage, n_microbatches, loss_fn=None, scale_grads=True):
        if not isinstance(n_microbatches, int) or n_microbatches < 1:
            raise ValueError(f"n_microbatches must be a positive int, got {n_microbatches!r}")
        self.stage, self.m, self.loss_fn, self.scale = stage, n_microbatches, loss_fn, scale_grads
        self.meter = Meter(stage.stage_index, ())  # replaced at each step

    def _check(self, args, target):
        """What is wrong here, as a code every stage sees (one all-gather): then every stage
        raises the same ValueError before anything is sent."""
        s = self.stage
        batch = args[0] if len(args) == 1 and torch.is_tensor(args[0]) else None
        code = 0
        if s.is_first and batch is None:
            code = 1
        elif s.is_first and (batch.shape[0] % self.m or batch.ndim == 0):
            code = 3
        elif s.is_last and (target is None or self.loss_fn is None):
            code = 2
        elif s.is_last and target.shape[0] % self.m:
            code = 3
        codes = [torch.zeros(1, dtype=torch.int64, device=s.device) for _ in range(s.num_stages)]
        all_gather(codes, torch.tensor([code], device=s.device), group=s.group)
        for st, c in enumerate(x.item() for x in codes):
            if c:
                what = {1: "the first stage needs one input tensor: step(x)",
                        2: "the last stage needs a loss_fn and its targets: step(target=y)",
                        3: f"n_microbatches = {self.m} must divide the batch size"}[c]
                raise ValueError(f"pipeline step refused on stage {st}: {what}")
        return batch

    def step(self, *args, target=None, losses=None):
        """One step through the pipeline; the last stage returns the outputs, others None."""
        s = self.stage
        batch = self._check(args, target)
        xs = batch.chunk(self.m) if s.is_first else [None] * self.m
        ys = target.chunk(self.m) if s.is_last else [None] * self.m
        self.meter = Meter(s.stage_index, s.submod.parameters())
        inputs, outputs, outs, pending = {}, {}, [], []
        for kind, i in self.order(s.stage_index, s.num_stages, self.m):
            if kind == "F":
                inputs[i] = xs[i] if s.is_first else self._recv_activation(i == 0)
                outputs[i] = self._forward(i, inputs[i], ys[i], outs, losses)
                if not s.is_last:
                    pending += self._send_activation(outputs[i].detach(), i == 0)
            else:
                grad = None if s.is_last else s.recv(torch.empty_like(outputs[i]), +1)
                self.meter.backward(i, lambda: torch.autograd.backward(outputs.pop(i), grad))
                x = inputs.pop(i)
                if not s.is_first:
                    pending.append(s.send(x.grad, -1))
        for work in pending:  # every send done before the buffers go
            work.wait()
        if self.scale and self.m > 1:
            for p in s.submod.parameters():
                if p.grad is not None:
                    p.grad.div_(self.m)
        return torch.cat(outs) if s.is_last else None

    def _forward(self, i, x, y, outs, losses):
        """Micro-batch i through this stage, metered; on the last stage, its loss."""
        def last(out):
            loss = self.loss(self.loss_fn, out, y, self.m)
            outs.append(out.detach())
            if losses is not None:
                losses.append(loss.detach())
            return loss
        return self.meter.forward(i, self.stage.submod, x, last if self.stage.is_last else None)

    # what the last step did: its trace, the micro-batches and bytes held at the peak
    trace = property(lambda self: self.meter.trace)
    peak_held = property(lambda self: self.meter.peak_held)
    peak_bytes = property(lambda self: self.meter.peak_bytes)

    def _send_activation(self, y, first):
        """The activation to the next stage; before the step's first, a header (its dtype
        and shape), so the next stage can make the buffer it receives into."""
        works = []
        if first:
            if y.dtype not in DTYPES or y.ndim > HEADER - 2:
                raise TypeError(f"stage {self.stage.stage_index}'s output: a {y.ndim}-d "
                                f"{y.dtype} tensor cannot be sent (dtypes: {DTYPES}, <= 6-d)")
            head = [DTYPES.index(y.dtype), y.ndim, *y.shape]
            head = torch.tensor(head + [0] * (HEADER - len(head)), device=self.stage.device)
            works.append(self.stage.send(head, +1))
        return works + [self.stage.send(y, +1)]

    def _recv_activation(self, first):
        if first:
            head = torch.zeros(HEADER, dtype=torch.int64, device=self.stage.device)
            head = self.stage.recv(head, -1).tolist()
            self.shape, self.dtype = head[2:2 + head[1]], DTYPES[head[0]]
        x = torch.empty(self.shape, dtype=self.dtype, device=self.stage.device)
        return self.stage.recv(x, -1).requires_grad_(x.is_floating_point())


class ScheduleGPipe(_Schedule):
    """GPipe: all m forwards, then all m backwards (holds m micro-batches' activations)."""


class Schedule1F1B(_Schedule):
    """1F1B: warm-up forwards, then one forward one backward (holds at most p micro-batches)."""
    order = staticmethod(lambda s, p, m: one_f_one_b(s, p, m))  # looked up at each call

    def __init__(self, stage, n_microbatches, loss_fn=None, scale_grads=True):
        super().__init__(stage, n_microbatches, loss_fn, scale_grads)
        if n_microbatches < stage.num_stages:
            raise ValueError(f"Schedule1F1B needs at least as many micro-batches as stages: "
                             f"n_microbatches {n_microbatches} < {stage.num_stages} stages")


# DIST_SGD_MINE: a learner's version replaces this one
swap_in(globals(), "one_f_one_b", ("one_f_one_b", "last_stage_loss"), lesson="19")
