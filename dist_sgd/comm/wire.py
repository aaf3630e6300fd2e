"""The wire our collectives talk over: one call's sends and receives, its trace, its VERBOSE print.

A Link wraps torch.distributed's isend/irecv for one collective call. The algorithms in
allreduce.py say *what* goes where; a Link only adds what every message needs on the way:

    link.at("reduce-scatter", step)         # name the step (for the trace and the print)
    link.exchange(mine, right, inbox, left)  # receive from left while sending to right
    link.send(t, dst) / link.recv(t, src)    # one direction only

- the trace: every message sent is appended, as a dict, to the caller's `trace` list
  {"algorithm", "phase", "step", "src", "dst", "chunk", "numel", "nbytes"} (lesson 04's table
  and GIF are drawn from it);
- DIST_SGD_VERBOSE=1 prints every send and receive:
  `[rank 1] send -> peer 2 chunk 0 (8 bytes)  [ring reduce-scatter step 0]`;
- receives are posted before sends (see exchange), and on NCCL the two go out as one batch.
"""
import os

import torch.distributed as dist


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


class Link:
    """One collective call's wire to its peers. Made afresh for every call (no module state):
    it reads DIST_SGD_VERBOSE then and appends to the caller's `trace` list, if any."""

    def __init__(self, algorithm, trace=None):
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        self.algorithm, self.trace = algorithm, trace
        self.verbose = os.environ.get("DIST_SGD_VERBOSE", "0") not in ("", "0")
        self.nccl = dist.get_backend() == "nccl"
        self.phase, self.step = "", 0

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
        ops = [(dist.irecv, t, peer) for t, peer, _ in recvs] + \
            [(dist.isend, t, peer) for t, peer, _ in sends]
        if self.nccl and len(ops) > 1:
            return dist.batch_isend_irecv([dist.P2POp(fn, t, peer) for fn, t, peer in ops])
        return [fn(t, peer) for fn, t, peer in ops]

    def exchange(self, send, dst, recv, src, send_chunk=None, recv_chunk=None):
        """Receive into `recv` from src while sending `send` to dst; return when both are done.

        Blocking send-then-recv on every rank of a ring would deadlock (each waits for a
        neighbour that is itself stuck sending); both posted first, nobody waits on anybody.
        """
        for request in self.start([(recv, src, recv_chunk)], [(send, dst, send_chunk)]):
            request.wait()

    def send(self, t, dst, chunk=None):
        for request in self.start(sends=[(t, dst, chunk)]):
            request.wait()

    def recv(self, t, src, chunk=None):
        for request in self.start(recvs=[(t, src, chunk)]):
            request.wait()
