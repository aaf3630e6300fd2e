"""The wire our collectives talk over: one call's sends and receives, its trace, its VERBOSE print.

A Link wraps torch.distributed's isend/irecv for one collective call. The algorithms in
allreduce.py say *what* goes where; a Link only adds what every message needs on the way:

    link.at("reduce-scatter", step)         # name the step (for the trace and the print)
    link.exchange(mine, right, inbox, left)  # receive from left while sending to right
    link.send(t, dst) / link.recv(t, src)    # one direction only

The trace (every message as a dict, for lesson 04's table and GIF), DIST_SGD_VERBOSE=1 (every
send and receive printed), receives posted before sends, rendezvous=True: see Link.

Every point-to-point message of the library goes through post() (or isend / irecv here): over
NCCL from device to device; over gloo, whose send/recv read only host memory ("writev ... Bad
address" on a CUDA tensor), a GPU tensor is staged through a host copy, as torch's own gloo
collectives do. Code on torch's own send/recv (comm/textbook, a learner's) gets it by
through_host().
"""
import functools
import os

import torch
import torch.distributed as dist

# A send returns once the kernel holds the bytes, not once they arrived: on a 100 Mbit/s link
# a 1 MiB send returns in 0.4 ms and lands 87 ms later (measured in a 2-node cluster; about
# 1 MB waits in the kernel). A rank that sends again at once then splits its link between
# two messages, and the first receiver waits longer than the algorithm's schedule says. With
# rendezvous=True a big message is followed by its receiver's 4-byte ack, and the sender's
# next message waits for it (MPI's rendezvous protocol for big messages); smaller ones go
# eagerly, where an ack's latency would cost more than the overlap.
RENDEZVOUS_BYTES = 64 * 1024


def _big(t):
    return t.numel() * t.element_size() >= RENDEZVOUS_BYTES


def split(n, parts):
    """Offsets of `parts` nearly equal pieces of n elements: the first n % parts get one more.

    split(7, 3) -> [0, 3, 5, 7]. Pieces may be empty (n < parts); every rank computes the same
    offsets, so sender and receiver always agree on a piece's size without asking.
    """
    base, extra = divmod(n, parts)
    offsets = [0]
    for i in range(parts):
        offsets.append(offsets[-1] + base + (1 if i < extra else 0))
    return offsets


def staged(t):
    """True when `t` must travel through host memory: a tensor off the CPU over gloo (or any
    backend but NCCL) - gloo's send/recv cannot read device memory."""
    return t.device.type != "cpu" and dist.get_backend() != "nccl"


class _Staged:
    """A request whose wait() also copies the host buffer a message landed in onto its device
    (a send's: keeps its host copy alive until then). Anything else: the request's own."""

    def __init__(self, work, host, into=None):
        self.work, self.host, self.into = work, host, into

    def wait(self, *timeout):
        done = self.work.wait(*timeout)
        if self.into is not None:
            self.into.copy_(self.host)
        return done

    def __getattr__(self, name):  # is_completed, _source_rank, ...
        return getattr(self.work, name)


def isend(t, peer, tag=0):
    """dist.isend to global rank `peer`, a tensor off the CPU over gloo staged through a copy."""
    if staged(t):
        host = t.detach().to("cpu", copy=True)
        return _Staged(dist.isend(host, peer, tag=tag), host)
    return dist.isend(t, peer, tag=tag)


def irecv(t, peer, tag=0):
    """dist.irecv from global rank `peer` (None: any); into `t` once wait() returns."""
    if staged(t):
        host = torch.empty(t.shape, dtype=t.dtype)  # on the CPU: the point of it
        return _Staged(dist.irecv(host, peer, tag=tag), host, t)
    return dist.irecv(t, peer, tag=tag)


def post(ops):
    """Start every (dist.irecv or dist.isend, tensor, global peer) of `ops`, in order; return
    their requests. Over NCCL several go out as one batch (batch_isend_irecv: a send and a
    receive between the same two ranks must be launched together); else one by one."""
    if dist.get_backend() == "nccl" and len(ops) > 1:
        return dist.batch_isend_irecv([dist.P2POp(fn, t, peer) for fn, t, peer in ops])
    return [(irecv if fn is dist.irecv else isend)(t, peer) for fn, t, peer in ops]


def through_host(fn):
    """fn(tensors or lists of tensors, ...) as it is, or, when a tensor needs staging (see
    staged), run on host copies of them all and the results copied back onto the device."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        flat = [a for arg in args for a in (arg if isinstance(arg, (list, tuple)) else [arg])]
        if not any(isinstance(a, torch.Tensor) and staged(a) for a in flat):
            return fn(*args, **kwargs)
        copies = {id(a): a.detach().to("cpu", copy=True) for a in flat
                  if isinstance(a, torch.Tensor)}

        def host(a):
            return copies[id(a)] if isinstance(a, torch.Tensor) else a
        result = fn(*[type(arg)(host(a) for a in arg) if isinstance(arg, (list, tuple))
                      else host(arg) for arg in args], **kwargs)
        for a in flat:
            if isinstance(a, torch.Tensor):
                a.copy_(copies[id(a)])
        return result
    return wrapper


class Link:
    """One collective call's wire to its peers. Made afresh for every call (no module state):
    it reads DIST_SGD_VERBOSE then and appends to the caller's `trace` list, if any.

    - the trace: every message sent is appended, as a dict, to `trace`: {"algorithm", "phase",
      "step", "src", "dst", "chunk", "numel", "nbytes"} (lesson 04's table and GIF);
    - DIST_SGD_VERBOSE=1 prints every send and receive:
      `[rank 1] send -> peer 2 chunk 0 (8 bytes)  [ring reduce-scatter step 0]`;
    - receives are posted before sends (see exchange), and on NCCL the two go out as one batch;
    - rendezvous=True (both ends pass it): a message of RENDEZVOUS_BYTES or more is acknowledged
      by its receiver, and the sender's call returns only once that ack is back."""

    def __init__(self, algorithm, trace=None, group=None):
        # Peers are ranks in `group`; messages go over the default group to their global
        # ranks (a pair of ranks shares one connection whatever subgroups it is in).
        self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)
        self.ranks = None if group is None else dist.get_process_group_ranks(group)
        self.algorithm, self.trace = algorithm, trace
        self.verbose = os.environ.get("DIST_SGD_VERBOSE", "0") not in ("", "0")
        self.nccl = dist.get_backend() == "nccl"
        self.phase, self.step = "", 0

    def glob(self, peer):
        """The global rank of `peer`, a rank in this link's group (None stays None)."""
        return peer if self.ranks is None or peer is None else self.ranks[peer]

    def at(self, phase, step):
        """Name the step the next messages belong to; returns the link, for chaining."""
        self.phase, self.step = phase, step
        return self

    def note(self, verb, peer, chunk, t, where=None):
        """Record a message in the trace (sends only) and print it under DIST_SGD_VERBOSE;
        where=(phase, step) names a step other than the current one."""
        nbytes = t.numel() * t.element_size()
        phase, step = where or (self.phase, self.step)
        if verb == "send" and self.trace is not None:
            self.trace.append({"algorithm": self.algorithm, "phase": phase, "step": step,
                               "src": self.rank, "dst": peer, "chunk": chunk,
                               "numel": t.numel(), "nbytes": nbytes})
        if self.verbose:
            arrow = "->" if verb == "send" else "<-"
            print(f"[rank {self.rank}] {verb} {arrow} peer {peer} chunk {chunk} ({nbytes} bytes)"
                  f"  [{self.algorithm} {phase} step {step}]", flush=True)

    def start(self, recvs=(), sends=()):
        """Post every receive, then every send; return the requests to wait() on.

        recvs and sends are lists of (tensor, peer, chunk). Receives go first: gloo's TCP
        transport writes a send from the caller's thread, and data for a receive not yet
        posted waits, so with the send first the two directions of a link take turns; with
        the receive already posted they run at once (lesson 11: a ring step twice as fast on
        a shaped link). NCCL needs a send and a receive between the same two ranks launched
        together, else each waits for the other's partner forever: batch_isend_irecv.
        """
        for t, peer, chunk in recvs:
            self.note("recv", peer, chunk, t)
        for t, peer, chunk in sends:
            self.note("send", peer, chunk, t)
        return post([(dist.irecv, t, self.glob(peer)) for t, peer, _ in recvs] +
                    [(dist.isend, t, self.glob(peer)) for t, peer, _ in sends])

    def exchange(self, send, dst, recv, src, send_chunk=None, recv_chunk=None, rendezvous=False):
        """Receive into `recv` from src while sending `send` to dst; return when both are done
        (with rendezvous=True: when dst has all of `send`, for a big one).

        Blocking send-then-recv on every rank of a ring would deadlock (each waits for a
        neighbour that is itself stuck sending); both posted first, nobody waits on anybody.
        """
        for request in self.start([(recv, src, recv_chunk)], [(send, dst, send_chunk)]):
            request.wait()
        if rendezvous:
            self._acks(recv, src, send, dst)

    def send(self, t, dst, chunk=None, rendezvous=False):
        for request in self.start(sends=[(t, dst, chunk)]):
            request.wait()
        if rendezvous:
            self._acks(None, None, t, dst)

    def recv(self, t, src, chunk=None, rendezvous=False):
        for request in self.start(recvs=[(t, src, chunk)]):
            request.wait()
        if rendezvous:
            self._acks(t, src, None, None)

    def _acks(self, received, src, sent, dst):
        """Tell src that a big `received` arrived; wait until dst says the same of `sent`."""
        ack = (received if sent is None else sent).new_zeros(1)
        wait = [(ack.clone(), dst, "ack")] if sent is not None and _big(sent) else []
        tell = [(ack, src, "ack")] if received is not None and _big(received) else []
        for request in self.start(wait, tell):
            request.wait()
