"""The wire our collectives talk over: one call's sends, receives, trace and VERBOSE print.

A Link wraps torch.distributed's isend/irecv for one collective call. It cuts big messages
into segments (both sides cut alike, so every receive expects exactly one send's bytes),
records each message sent into the caller's `trace` list, prints every send and receive when
DIST_SGD_VERBOSE=1, and on NCCL launches a send together with the next receive. The
algorithms in allreduce.py say *what* goes where; this file says how a message travels.
"""
import os

import torch
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


# Big messages travel in segments of SEGMENT_BYTES, so that reducing (and passing on) one
# segment overlaps with receiving the next; received segments go through WINDOW scratch
# buffers. Measured on loopback gloo: a message costs ~0.1-0.2 ms on its own, so smaller
# segments lose; and a fresh chunk-sized scratch buffer costs page faults on every call
# (as much as the transfer, at 32 MiB), while a few MiB get reused by the allocator.
SEGMENT_BYTES = 1 << 20
WINDOW = 4


class Link:
    """One collective call's wire to its peers: sends, receives, the trace, the verbose print.

    Made afresh for every call (no module-level state): it reads DIST_SGD_VERBOSE then,
    appends one dict per message sent to the caller's `trace` list, if any, and keeps the
    call's one scratch buffer for reductions, reused at every step.
    """

    def __init__(self, algorithm, trace=None):
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        self.algorithm, self.trace = algorithm, trace
        self.verbose = os.environ.get("DIST_SGD_VERBOSE", "0") not in ("", "0")
        self.nccl = dist.get_backend() == "nccl"
        self.phase, self.step, self.scratch = "", 0, None
        self.sending = []  # (chunk, handle) of sends posted but not yet waited for: flush()
        # NCCL runs a send and a receive between the same two ranks on one stream: each
        # would wait for the other's partner forever unless both are launched as one group
        # (batch_isend_irecv). So on NCCL sends wait here for the next receive, or flush().
        self.queued = []

    def at(self, phase, step):
        self.phase, self.step = phase, step
        return self

    def note(self, verb, peer, chunk, t, where=None):
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

    def cut(self, t):
        """t as the messages it travels in: segments of SEGMENT_BYTES (none if t is empty).
        Both sides know the size, so they cut alike: a receive expects exactly one send's
        bytes. NCCL sends whole chunks (see exchange_reduce)."""
        if t is None or t.numel() == 0:
            return []
        seg = max(1, SEGMENT_BYTES // t.element_size())
        return [t] if self.nccl or t.numel() <= seg else list(t.split(seg))

    def _post(self, sends, dst, recvs, src, send_chunk=None, recv_chunk=None, where=None):
        """Start sends to dst and receives from src; keep the send handles (see flush) and
        return the receive handles, in order. `where` = (phase, step) for the trace."""
        for t in sends:
            self.note("send", dst, send_chunk, t, where)
        for t in recvs:
            self.note("recv", src, recv_chunk, t)
        ops = [(dist.isend, t, dst, send_chunk) for t in sends]
        if self.nccl:  # hold sends back until a receive (or flush) can be launched with them
            ops, self.queued = self.queued + ops, []
            if not recvs:
                self.queued = ops
                return []
        n_send = len(ops)
        ops += [(dist.irecv, t, src, recv_chunk) for t in recvs]
        if self.nccl and len(ops) > 1:
            works = dist.batch_isend_irecv([dist.P2POp(fn, t, peer) for fn, t, peer, _ in ops])
        else:
            works = [fn(t, peer) for fn, t, peer, _ in ops]
        self.sending += [(op[3], work) for op, work in zip(ops[:n_send], works[:n_send])]
        return works[n_send:]

    def isend(self, t, dst, chunk=None, where=None):
        """Start sending t to dst; flush() waits for it."""
        self._post(self.cut(t), dst, [], None, send_chunk=chunk, where=where)

    def irecv(self, t, src, chunk=None):
        """Start receiving into t from src; returns the handles to wait() on."""
        return self._post([], None, self.cut(t), src, recv_chunk=chunk)

    def recv(self, t, src, chunk=None):
        for work in self.irecv(t, src, chunk):
            work.wait()

    def exchange(self, send, dst, recv, src, send_chunk=None, recv_chunk=None):
        """Send `send` to dst while receiving into `recv` from src (empty ones are skipped:
        both sides know every size, so both skip the same ones).

        Both are posted before waiting on either: if every rank of a ring did a blocking send
        first, each would wait for a neighbour itself stuck sending (a deadlock: on gloo a send
        waits until its receiver is ready). isend first lets both directions move at once."""
        for work in self._post(self.cut(send), dst, self.cut(recv), src, send_chunk, recv_chunk):
            work.wait()

    def exchange_reduce(self, send, dst, acc, src, reduce, send_chunk=None, recv_chunk=None,
                        reduced=None):
        """Like exchange(), but what arrives from src is reduced into acc: acc <- op(acc, it).

        The incoming segments land in a window of scratch buffers, each reposted as soon as
        its segment has been reduced, so adding one segment overlaps with receiving the next.
        reduced(piece), if given, is called with each finished segment of acc (to pass it on).
        NCCL gets one message and a chunk-sized buffer (GPU memory is cached, and a send and
        a receive between two ranks must be launched together).
        """
        pieces = self.cut(acc)
        if not pieces:
            self.exchange(send, dst, None, src, send_chunk)
            return
        seg, slots = pieces[0].numel(), min(WINDOW, len(pieces))
        if self.scratch is None or self.scratch.numel() < slots * seg or self.scratch.dtype != acc.dtype:
            self.scratch = torch.empty(slots * seg, dtype=acc.dtype, device=acc.device)
        bufs = [self.scratch[i * seg:(i + 1) * seg] for i in range(slots)]
        pending = self._post(self.cut(send), dst, [bufs[i][:pieces[i].numel()] for i in range(slots)],
                             src, send_chunk, recv_chunk)
        for i, piece in enumerate(pieces):
            pending.pop(0).wait()  # segments from one peer arrive in the order they were sent
            reduce(piece, bufs[i % slots][:piece.numel()])
            if reduced is not None:
                reduced(piece)
            if i + slots < len(pieces):  # this buffer is free again: post a later segment
                later = bufs[i % slots][:pieces[i + slots].numel()]
                pending += self._post([], dst, [later], src, recv_chunk=recv_chunk)

    def flush(self, chunk=None):
        """Wait for the sends still in flight (of one chunk, or all). Steps wait only for
        their receives, not their sends, so a rank need not wait for its right neighbour to
        catch up; but a buffer must not be overwritten, nor handed back, while a send reads it."""
        if self.queued and (chunk is None or any(op[3] == chunk for op in self.queued)):
            self.queued, ops = [], self.queued
            works = dist.batch_isend_irecv([dist.P2POp(fn, t, peer) for fn, t, peer, _ in ops])
            self.sending += [(op[3], work) for op, work in zip(ops, works)]
        keep = []
        for c, work in self.sending:
            if chunk is None or c == chunk:
                work.wait()
            else:
                keep.append((c, work))
        self.sending = keep
