"""A parameter server on send/recv: servers hold the weights, workers pull them and push gradients.

    servers, workers = roles(world_size, num_servers=1)      # ranks [0], [1, .., W-1]
    if rank in servers:
        stats = ParameterServer(model, servers, workers, lr=0.05, mode="async").serve()
    else:
        worker = Worker(model, servers)
        while worker.pull():                 # the newest weights (False: the server has enough)
            x, y = next(batches)
            model.zero_grad(); F.nll_loss(model(x), y).backward()
            worker.push()                    # my gradient, to every server
        worker.finish()                      # "done"; then the final weights

The parameters are one flat vector cut into contiguous shards, one per server (Downpour SGD,
Dean et al. 2012), so every server moves and updates only its share. Each server steps its
shard with dist_sgd.sgd.optim.SGD, elementwise, as an optimizer would step the whole model.

mode="sync" is all-reduce SGD computed in one place, mode="async" applies each gradient as
it arrives; the messages, and what travels: ParameterServer's docstring.
"""
import datetime

import torch
import torch.distributed as dist

from dist_sgd.comm.flat import copy_back, flatten
from dist_sgd.comm.wire import irecv, isend
from dist_sgd.plumbing.rank import device
from dist_sgd.sgd.optim import SGD

GRAD, DONE = 0, 1
HEADER_TAG, DATA_TAG = 11, 12
MODES = ("sync", "async")
TIMEOUT = 60.0


def roles(world_size, num_servers=1):
    """(server ranks, worker ranks): the first `num_servers` ranks serve, the rest work."""
    if isinstance(num_servers, bool) or not isinstance(num_servers, int) or num_servers < 1:
        raise ValueError(f"num_servers must be a positive integer, got {num_servers!r}")
    if world_size <= num_servers:
        raise ValueError(f"a parameter server needs at least one worker: world size {world_size} "
                         f"with {num_servers} server(s) leaves none; use world size "
                         f">= {num_servers + 1}")
    return list(range(num_servers)), list(range(num_servers, world_size))


def shard_bounds(numel, num_shards):
    """[(start, end)] of `num_shards` contiguous pieces of a vector, sizes differing by <= 1."""
    if num_shards > numel:
        raise ValueError(f"{num_shards} servers for {numel} parameters: some would hold nothing")
    base, extra = divmod(numel, num_shards)
    bounds, start = [], 0
    for s in range(num_shards):
        end = start + base + (1 if s < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def _params(model):
    """The parameters that travel: trainable ones, a tied one once (parameters() dedups)."""
    return [p for p in model.parameters() if p.requires_grad]


def flat_weights(model):
    return flatten(_params(model))


def flat_gradients(model):
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                      for p in _params(model)])


def _check_ranks(servers, workers):
    if not servers or not workers or set(servers) & set(workers):
        raise ValueError(f"servers {servers} and workers {workers} must be non-empty and disjoint")


class ParameterServer:
    """One server: holds its shard of the weights, serves `workers` until all are done.

    mode="sync": a server waits for a gradient from every worker, averages them, steps once and
      sends the new weights to all: all-reduce SGD, computed in one place (equal within rounding).
    mode="async": a server applies each gradient as it arrives and sends the result back to its
      sender only. A gradient computed on weights that have since been updated k times has
      *staleness* k; `staleness_aware=True` divides the learning rate by it (Zhang et al. 2016).

    The protocol. Every message from a worker is a header [kind, step, has_grad...] (kind GRAD or
    DONE; one 0/1 per trainable parameter: did it get a gradient) on HEADER_TAG, for GRAD
    followed by the gradient shard on DATA_TAG; a server answers with weights
    on DATA_TAG. A worker that is done sends DONE and waits for the final weights, which every
    server sends to every worker once all of them are done. Nothing waits forever: a server that
    hears nothing from its workers for `timeout` seconds raises, naming the silent workers, and
    a rank that dies is reported by launch() (its peers' receives fail).

    Only trainable parameters travel (frozen ones stay as each worker built them; buffers such as
    BatchNorm statistics stay on each worker). A trainable parameter that got no gradient in a
    step (p.grad is None) travels as zeros, and the header says so: the server steps its shard
    parameter by parameter (one view each), and skips a parameter no worker of this update had a
    gradient for, as torch.optim.SGD skips it (no momentum or weight decay moves it). One that
    some workers of a sync step had a gradient for and others not is averaged with zeros for the
    others, as DDP does for an unused parameter.
    """

    def __init__(self, model, servers, workers, lr, momentum=0.0, weight_decay=0.0, mode="sync",
                 staleness_aware=False, max_updates=None, timeout=TIMEOUT):
        _check_ranks(servers, workers)
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.rank, self.servers, self.workers = dist.get_rank(), list(servers), list(workers)
        self.mode, self.staleness_aware, self.timeout, self.lr = mode, staleness_aware, timeout, lr
        self.max_updates = max_updates  # None: until the workers say they are done
        flat = flat_weights(model).to(device())
        self.lo, self.hi = shard_bounds(flat.numel(), len(servers))[self.servers.index(self.rank)]
        self.weights = flat[self.lo:self.hi].clone()
        self.num_params = len(_params(model))
        # The shard cut at parameter boundaries: (parameter index, start, end) within the shard,
        # each stepped as its own Parameter, a view of self.weights (so a missing gradient
        # skips exactly that parameter, as torch's SGD does).
        self.pieces, start = [], 0
        for i, p in enumerate(_params(model)):
            a, b = max(start, self.lo), min(start + p.numel(), self.hi)
            if a < b:
                self.pieces.append((i, a - self.lo, b - self.lo))
            start += p.numel()
        self.params = [torch.nn.Parameter(self.weights[a:b]) for _, a, b in self.pieces]
        self.optimizer = SGD(self.params, lr=lr, momentum=momentum, weight_decay=weight_decay)
        self.version = 0  # updates applied so far
        self.staleness = []  # one entry per update: how many updates the gradient missed
        self.bytes_sent = self.bytes_received = 0

    def _send_weights(self, ranks, more=True):
        """Send [version, more] and the weights; more=0 asks the worker to stop."""
        more = more and (self.max_updates is None or self.version < self.max_updates)
        header = torch.tensor([self.version, int(more)], device=self.weights.device)
        works = []
        for w in ranks:
            works += [isend(header, w, tag=HEADER_TAG),
                      isend(self.weights.detach(), w, tag=DATA_TAG)]
        self.bytes_sent += len(ranks) * (header.numel() * header.element_size()
                                         + self.weights.numel() * self.weights.element_size())
        for work in works:
            work.wait()

    def _receive_header(self, src=None):
        """(sender, kind, has_grad) of the next header from worker `src`, or from any worker
        (None). Waits at most `timeout` seconds: a worker that stops talking ends the run, named."""
        header = torch.zeros(2 + self.num_params, dtype=torch.int64, device=self.weights.device)
        work = irecv(header, src, tag=HEADER_TAG)
        try:
            work.wait(datetime.timedelta(seconds=self.timeout))
        except RuntimeError as e:
            if "timed out" not in str(e).lower():
                raise  # e.g. the connection closed: the worker died (launch() names it)
            silent = [src] if src is not None else self.waiting_for
            raise TimeoutError(f"parameter server rank {self.rank}: no message from "
                               f"{', '.join(f'worker rank {w}' for w in silent)} for "
                               f"{self.timeout:g} s (hung or too slow?)") from None
        return (src if src is not None else work._source_rank()), int(header[0]), header[2:].bool()

    def _receive_gradient(self, w):
        grad = torch.empty_like(self.weights)
        irecv(grad, w, tag=DATA_TAG).wait()  # sent right behind its header
        self.bytes_received += grad.numel() * grad.element_size()
        return grad

    def _apply(self, grad, has_grad, staleness):
        """One SGD step of the shard; lr / staleness when staleness-aware. A parameter without
        a gradient (has_grad False) gets grad None: the optimizer skips it."""
        lr = self.lr / max(1, staleness) if self.staleness_aware else self.lr
        self.optimizer.param_groups[0]["lr"] = lr
        for p, (i, a, b) in zip(self.params, self.pieces):
            p.grad = grad[a:b] if has_grad[i] else None
        self.optimizer.step()
        self.version += 1

    def serve(self):
        """Run until every worker is done; return {"updates", "staleness", bytes counts, ...}."""
        if self.mode == "async" and dist.get_backend() != "gloo":
            raise NotImplementedError("the asynchronous parameter server receives from any "
                                      "worker, which only gloo offers: use backend='gloo'")
        self._send_weights(self.workers)  # everyone starts from version 0
        sent_version = {w: 0 for w in self.workers}  # the version each worker computes on
        self.waiting_for = list(self.workers)  # workers not done yet
        while self.waiting_for:
            if self.mode == "sync":  # a message from every worker, then one step
                headers = {w: self._receive_header(w) for w in self.workers}
                kinds = {w: h[1] for w, h in headers.items()}
                if set(kinds.values()) == {DONE}:
                    break
                if DONE in kinds.values():
                    raise RuntimeError(f"sync parameter server rank {self.rank}: workers "
                                       f"disagree on the number of steps (kind by worker, "
                                       f"1 = done: {kinds})")
                total = torch.zeros_like(self.weights)
                for w in self.workers:  # a fixed order: the same sum on every run
                    total += self._receive_gradient(w)
                has_grad = torch.stack([h[2] for h in headers.values()]).any(0)
                self.staleness += [0] * len(self.workers)  # every gradient saw the newest weights
                self._apply(total / len(self.workers), has_grad, staleness=0)
                self._send_weights(self.workers)
            else:  # async: whoever comes first is served first
                w, kind, has_grad = self._receive_header()
                if kind == DONE:
                    self.waiting_for.remove(w)
                    continue
                staleness = self.version - sent_version[w]
                self.staleness.append(staleness)
                self._apply(self._receive_gradient(w), has_grad, staleness)
                self._send_weights([w])
                sent_version[w] = self.version
        self._send_weights(self.workers, more=False)  # the final weights, for finish()
        return {"rank": self.rank, "updates": self.version, "staleness": self.staleness,
                "bytes_sent": self.bytes_sent, "bytes_received": self.bytes_received,
                "shard": (self.lo, self.hi), "weights": self.weights.cpu().clone()}


class Worker:
    """A worker's side: pull() the weights into `model`, push() its gradients, finish()."""

    def __init__(self, model, servers):
        self.model, self.servers = model, list(servers)
        numel = sum(p.numel() for p in _params(model))
        self.bounds = shard_bounds(numel, len(self.servers))
        self.steps = self.bytes_sent = self.bytes_received = self.version = 0

    def _send(self, kind, flat=None):
        has_grad = [int(p.grad is not None) for p in _params(self.model)]
        header = torch.tensor([kind, self.steps] + has_grad, dtype=torch.int64, device=device())
        works = []
        for s, (lo, hi) in zip(self.servers, self.bounds):
            works.append(isend(header, s, tag=HEADER_TAG))
            if flat is not None:
                works.append(isend(flat[lo:hi], s, tag=DATA_TAG))
        self.bytes_sent += len(self.servers) * header.numel() * header.element_size()
        if flat is not None:
            self.bytes_sent += flat.numel() * flat.element_size()
        for work in works:
            work.wait()

    @torch.no_grad()
    def pull(self):
        """Receive every server's shard into the model's parameters. False: the servers want
        no more gradients (max_updates reached): stop, and call finish()."""
        flat = torch.empty_like(flat_weights(self.model))
        headers = torch.zeros(len(self.servers), 2, dtype=torch.int64, device=flat.device)
        works = []
        for i, (s, (lo, hi)) in enumerate(zip(self.servers, self.bounds)):
            works += [irecv(headers[i], s, tag=HEADER_TAG),
                      irecv(flat[lo:hi], s, tag=DATA_TAG)]
        for work in works:
            work.wait()
        self.bytes_received += flat.numel() * flat.element_size() + headers.numel() * 8
        copy_back(flat, _params(self.model))
        self.version = int(headers[:, 0].min())
        return bool(headers[:, 1].min())

    def push(self):
        """Send this worker's gradients (p.grad of every parameter) to the servers."""
        self._send(GRAD, flat_gradients(self.model).contiguous())
        self.steps += 1

    def finish(self):
        """Tell the servers this worker is done, then pull the final weights."""
        self._send(DONE)
        self.pull()
        return {"steps": self.steps, "bytes_sent": self.bytes_sent,
                "bytes_received": self.bytes_received}
