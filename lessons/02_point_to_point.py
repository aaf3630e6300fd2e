"""Lesson 02: point-to-point messages, send/recv, isend/irecv, and what a message costs.

Everything distributed training does is built from one primitive: rank a sends a tensor,
rank b receives it into a tensor of the same size. (Lessons 03-04 build every collective,
all-reduce included, from nothing else.)

What this lesson does:
  1. blocking send/recv: each rank passes a tensor to its right neighbour around a ring,
     N-1 times, adding up what arrives; after N-1 steps every rank holds the sum of all
     ranks' tensors, which we check against torch's dist.all_reduce.
     On gloo a send does not finish until the receiver has posted the matching receive,
     whatever the size: if every rank sent first, all would wait forever (a deadlock).
     The ring avoids it the classic way: even ranks send first, odd ranks receive first.
  2. non-blocking isend/irecv: each call only *starts* a transfer and returns a request;
     request.wait() finishes it. With both directions in flight at once, order no longer
     matters. The same ring again, checked again.
  3. the rule: until wait() returns, the buffers belong to the transport. We break it on
     purpose: read a receive buffer too early (old contents), and overwrite a send buffer
     after isend (the receiver gets the *new* values: gloo reads the buffer only when the
     receiver is ready). Safe usage: wait() first, or send a copy.
  4. a ping-pong between ranks 0 and 1 (dist_sgd.p2p.ping_pong) that times messages from
     8 bytes to 64 MiB, and fits the alpha-beta model  t(n) = alpha + beta * n:
       alpha  latency: the time of an empty message (software, kernel, network round trip),
       beta   seconds per byte (1 / bandwidth): what every extra byte costs.
     Small messages cost alpha, large ones n * beta; the crossover n = alpha / beta says
     how big a message must be before bandwidth matters. Here the "network" is the memory
     of one machine, so alpha is tens of microseconds and the bandwidth a few GB/s; on
     10 Gbit/s Ethernet the bandwidth is ~1.2 GB/s and alpha tens of microseconds or more.

Run it (from the repository root):
    python lessons/02_point_to_point.py --world-size 2
    torchrun --standalone --nproc-per-node 2 lessons/02_point_to_point.py

Exercises:
  1. Make every rank call dist.send before dist.recv in the ring (with a short `timeout`
     in launch) and read the error. Which rank does the launcher blame, and why?
  2. Run the ping-pong with --world-size 3: does an idle third process change the numbers
     on a 2-core laptop? Why?
  3. From alpha and beta, predict the time to send Net's 21,840 float32 gradients as one
     message, and as 8 messages (one per parameter tensor). Which is cheaper, and by how much?
  4. Set DIST_SGD_VERBOSE=1 and run lesson 03: every send and receive of the collectives
     is printed; count them for one all-reduce.
"""
import os
import sys
import time

import torch
import torch.distributed as dist

from dist_sgd.costmodel import fit_alpha_beta  # noqa: E402
from dist_sgd.launch import device, launch, lesson_parser, log, rank_print  # noqa: E402
from dist_sgd.p2p import ping_pong, ring_shift  # noqa: E402

SIZES = [8 * 8 ** k for k in range(8)] + [64 * 2 ** 20]  # 8 B, 64 B, ..., 16 MiB, 64 MiB
QUICK_SIZES = [8, 4096, 2 ** 18, 2 ** 22]


def rate(bytes_per_second):
    """1234567 -> '1.23 MB/s'."""
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bytes_per_second >= scale:
            return f"{bytes_per_second / scale:.3g} {unit}"
    return f"{bytes_per_second:.3g} B/s"


def ring_sum(blocking):
    """Pass tensors around the ring N-1 times, summing what arrives; check vs all_reduce."""
    rank, size = dist.get_rank(), dist.get_world_size()
    mine = torch.arange(4, dtype=torch.float32, device=device()) + 10 * rank
    total, travelling = mine.clone(), mine
    for step in range(size - 1):
        travelling = ring_shift(travelling, blocking=blocking)
        total += travelling
        if step == 0:
            rank_print(f"step 1: received {travelling.tolist()} from rank {(rank - 1) % size}")
    expected = mine.clone()
    dist.all_reduce(expected)  # torch's own
    diff = (total - expected).abs().max()
    dist.all_reduce(diff, op=dist.ReduceOp.MAX)
    torch.testing.assert_close(total, expected)
    log(f"after {size - 1} steps every rank holds {total.tolist()}; dist.all_reduce gives "
        f"{expected.tolist()}: max difference over all ranks {diff.item():g}")


def buffer_rules(rank):
    """Break the isend/irecv rule on purpose (ranks 0 and 1), then do it right."""
    n = 2 ** 20
    # Receive side: read before wait(). Rank 0 sends only after a pause.
    dist.barrier()
    if rank == 0:
        time.sleep(0.3)
        dist.send(torch.ones(4, device=device()), 1)
    elif rank == 1:
        buf = torch.zeros(4, device=device())
        request = dist.irecv(buf, 0)
        rank_print(f"irecv posted; before wait(): completed={request.is_completed()}, "
                   f"buffer={buf.tolist()} (old contents: the message is not here yet)")
        request.wait()
        rank_print(f"after wait(): completed={request.is_completed()}, buffer={buf.tolist()}")
    # Send side: overwrite after isend, before wait(). Rank 1 posts its receive late.
    dist.barrier()
    if rank == 0:
        data = torch.ones(n, device=device())
        request = dist.isend(data, 1)
        data.fill_(2.0)  # WRONG: the transfer may not have read `data` yet
        request.wait()
        safe = torch.ones(n, device=device())
        request = dist.isend(safe.clone(), 1)  # right: send a copy (or wait() before writing)
        safe.fill_(2.0)
        request.wait()
    elif rank == 1:
        got, got_safe = torch.zeros(n, device=device()), torch.zeros(n, device=device())
        time.sleep(0.3)
        dist.recv(got, 0)
        dist.recv(got_safe, 0)
        changed = int((got == 2.0).sum())
        rank_print(f"rank 0 sent ones, then overwrote them with 2.0 before wait(): {changed:,} "
                   f"of {n:,} values arrived as 2.0. Undefined behaviour: it depends on the "
                   "backend and on timing, so it can look fine in a test and fail at scale.")
        diff = (got_safe - 1.0).abs().max().item()
        rank_print(f"sending a copy instead: all ones arrived, max difference {diff:g}")
        torch.testing.assert_close(got_safe, torch.ones(n, device=device()))
    dist.barrier()  # let rank 1 finish its story before rank 0 prints the next part


def lesson(rank, world_size, quick):
    log(f"\n--- 1. blocking send/recv around a ring of {world_size} ---")
    ring_sum(blocking=True)
    log("\n--- 2. non-blocking isend/irecv + wait(), the same ring ---")
    ring_sum(blocking=False)
    log("\n--- 3. the rule: do not touch a buffer before wait() ---")
    buffer_rules(rank)
    log(f"\n--- 4. ping-pong between ranks 0 and 1 (one-way time = round trip / 2, median "
        f"of {5 if quick else 20} samples) ---")
    rows = ping_pong(QUICK_SIZES if quick else SIZES, repeats=5 if quick else 20)
    alpha, beta = fit_alpha_beta([r["bytes"] for r in rows], [r["seconds"] for r in rows])
    log(f"{'bytes':>10} {'one-way':>10} {'min':>10} {'max':>10} {'bandwidth':>11} "
        f"{'alpha+beta*n':>13}")
    for r in rows:
        log(f"{r['bytes']:>10,} {r['seconds'] * 1e6:>8.1f}us {r['min'] * 1e6:>8.1f}us "
            f"{r['max'] * 1e6:>8.1f}us {rate(r['bandwidth']):>11} "
            f"{(alpha + beta * r['bytes']) * 1e6:>11.1f}us")
    log(f"fit: alpha = {alpha * 1e6:.1f} us per message, beta = {beta * 1e9:.3f} ns per byte "
        f"(bandwidth {1 / beta / 1e9 if beta else float('inf'):.2f} GB/s); a message must be "
        f"about alpha/beta = {alpha / beta if beta else float('inf'):,.0f} bytes before "
        "its bytes cost as much as its latency")
    return rows


def main():
    parser = lesson_parser(__doc__)
    args = parser.parse_args()
    if args.world_size < 2 and "WORLD_SIZE" not in os.environ:
        parser.error("point-to-point needs two ranks or more: --world-size 2")
    launch(lesson, args.world_size, args.quick, backend=args.backend)


if __name__ == "__main__":
    main()
