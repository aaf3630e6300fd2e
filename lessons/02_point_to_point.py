"""Lesson 02: point-to-point messages: send/recv, isend/irecv, and what a message costs.

Everything distributed training does is built from one primitive: rank a sends a tensor,
rank b receives it into a tensor of the same size. (Lessons 03-04 build every collective,
all-reduce included, from nothing else.) This lesson writes each step itself:

  1. blocking dist.send / dist.recv around a ring: each rank passes a tensor to its right
     neighbour, N-1 times, adding up what arrives; after N-1 steps every rank holds the sum
     of all ranks' tensors (checked against torch's dist.all_reduce). A blocking send may
     not return until the receiver has posted its receive: if every rank sent first, all
     could wait forever (a deadlock). The classic fix: even ranks send first, odd ranks
     receive first.
  2. non-blocking dist.irecv / dist.isend: each call only *starts* a transfer and returns a
     request; request.wait() finishes it. Post the receive first, then the send, then wait
     for both: nobody waits on anybody, and both directions of a link run at once (on gloo
     a send posted before the matching receive makes the two directions take turns).
  3. the buffer rule: until wait() returns, the buffers belong to the transport. We break
     it on purpose (read a receive buffer too early; overwrite a send buffer after isend),
     then do it right: wait() first, or send a copy.
  4. ping-pong: rank 0 sends n bytes, rank 1 sends them straight back; one-way time = round
     trip / 2. First by hand for three sizes, then measured carefully from 8 bytes to 64 MiB
     (dist_sgd.comm.p2p.ping_pong: the same loop, timed interleaved with medians), and fitted to
     the alpha-beta model  t(n) = alpha + beta * n:
       alpha  latency: the time of an empty message (software, kernel, network round trip),
       beta   seconds per byte (1 / bandwidth): what every extra byte costs.
     Small messages cost alpha, large ones n * beta. Here the "network" is the memory of one
     machine (loopback TCP), so alpha is tens of microseconds and the bandwidth a few GB/s
     at best; on a 2-core laptop the two ranks also compete for the cores.

Run it (from the repository root):
    python lessons/02_point_to_point.py --world-size 2
    torchrun --standalone --nproc-per-node 2 lessons/02_point_to_point.py

Exercises:
  0. Write the ring of section 1 yourself: `python3 -m dist_sgd.course start ring_sum` gives
     you ring_sum with its body to write, `... check ring_sum` grades it against
     dist.all_reduce at world sizes 1-4 (a deadlock is a failed check, not a hang), and
     `DIST_SGD_MINE=mine python3 lessons/02_point_to_point.py` runs this lesson on yours.
  1. Make every rank call dist.send before dist.recv in ring_sum (and a short `timeout` in
     launch) and read the error. Which rank does the launcher blame?
  2. Run with --world-size 3: does an idle third process change the ping-pong on 2 cores?
  3. From alpha and beta, predict the time to send Net's 21,840 float32 gradients as one
     message, and as 8 messages (one per parameter tensor). Which is cheaper, and by how much?
  4. Set DIST_SGD_VERBOSE=1 and run lesson 03: every send and receive of the collectives
     is printed; count them for one all-reduce.
"""
import time

import torch
import torch.distributed as dist

from dist_sgd.plumbing.check import check, max_diff
from dist_sgd.scale.costmodel import fit_alpha_beta
from dist_sgd.plumbing.launch import launch, lesson_parser
from dist_sgd.plumbing.rank import device, log, rank_print
from dist_sgd.comm.p2p import ping_pong
from dist_sgd.plumbing.mine import swap_in

SIZES = [8 * 8 ** k for k in range(8)] + [64 * 2 ** 20]  # 8 B, 64 B, ..., 16 MiB, 64 MiB
QUICK_SIZES = [8, 4096, 2 ** 18, 2 ** 22]


def ring_sum(tensor):
    """The sum of every rank's tensor: passed p-1 times to the right with blocking send/recv."""
    rank, size = dist.get_rank(), dist.get_world_size()
    # ---- exercise ring_sum: p-1 steps of blocking send/recv around the ring, no deadlock
    right, left = (rank + 1) % size, (rank - 1) % size
    total, travelling = tensor.clone(), tensor
    for _ in range(size - 1):
        arrived = torch.empty_like(travelling)
        if rank % 2 == 0:  # even ranks talk first...
            dist.send(travelling, right)
            dist.recv(arrived, left)
        else:  # ...odd ranks listen first
            dist.recv(arrived, left)
            dist.send(travelling, right)
        total += arrived
        travelling = arrived  # pass on what we got
    return total
    # ---- end of exercise


def ring_sum_nonblocking(tensor):
    """The same ring with irecv/isend: post the receive, then the send; wait for both."""
    rank, size = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % size, (rank - 1) % size
    total, travelling = tensor.clone(), tensor
    for _ in range(size - 1):
        arrived = torch.empty_like(travelling)
        ops = [dist.P2POp(dist.irecv, arrived, left), dist.P2POp(dist.isend, travelling, right)]
        # batch_isend_irecv calls dist.irecv, then dist.isend, and returns their requests (NCCL
        # needs a send and a receive between the same two ranks launched together: one batch)
        for request in dist.batch_isend_irecv(ops):
            request.wait()
        total += arrived
        travelling = arrived  # pass on what we got
    return total


def check_ring(title, ring, rank):
    log(f"\n--- {title} ---")  # then the ring's sum of [10r, 10r+1, ...] against torch's
    mine = torch.arange(4, dtype=torch.float32, device=device()) + 10 * rank
    total, expected = ring(mine), mine.clone()
    dist.all_reduce(expected)  # torch's own
    diffs = [None] * dist.get_world_size()
    dist.all_gather_object(diffs, max_diff(total, expected))
    log(check(f"{ring.__name__} = {total.tolist()} vs dist.all_reduce, all ranks", max(diffs), 0))


def buffer_rule(rank):
    """Break the isend/irecv rule on purpose (ranks 0 and 1), then do it right."""
    n = 2 ** 20
    dist.barrier()
    if rank == 0:  # receive side: rank 1 reads before wait(); rank 0 sends after a pause
        time.sleep(0.3)
        dist.send(torch.ones(4, device=device()), 1)
    elif rank == 1:
        buf = torch.zeros(4, device=device())
        request = dist.irecv(buf, 0)
        rank_print(f"irecv posted; before wait(): completed={request.is_completed()}, "
                   f"buffer={buf.tolist()} (old contents: the message is not here yet)")
        request.wait()
        rank_print(f"after wait(): completed={request.is_completed()}, buffer={buf.tolist()}")
    dist.barrier()
    if rank == 0:  # send side: overwrite after isend, before wait(); rank 1 receives late
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
        rank_print(f"rank 0 sent ones, then overwrote them with 2.0 before wait(): "
                   f"{int((got == 2.0).sum()):,} of {n:,} values arrived as 2.0 (undefined "
                   "behaviour: it depends on the backend and on timing)")
        rank_print(check("sending a copy instead: received vs ones",
                         max_diff(got_safe, torch.ones_like(got_safe)), 0.0))
    dist.barrier()  # let rank 1 finish its story before rank 0 prints the next part


def ping_pong_by_hand(rank, nbytes, round_trips=20):
    """Rank 0 sends, rank 1 echoes; returns rank 0's one-way time (others: 0)."""
    buf = torch.zeros(nbytes, dtype=torch.uint8, device=device())
    dist.barrier()
    start = time.perf_counter()
    for _ in range(round_trips):
        if rank == 0:
            dist.send(buf, 1)
            dist.recv(buf, 1)
        elif rank == 1:
            dist.recv(buf, 0)
            dist.send(buf, 0)
    return (time.perf_counter() - start) / round_trips / 2


def run(rank, size, args):
    check_ring(f"1. blocking send/recv around a ring of {size}", ring_sum, rank)
    check_ring("2. non-blocking irecv/isend + wait(), the same ring", ring_sum_nonblocking, rank)
    if size < 2:
        log("\n(sections 3-4 need two ranks: run with --world-size 2)")
        return None
    log("\n--- 3. the rule: do not touch a buffer before wait() ---")
    buffer_rule(rank)
    log("\n--- 4. ping-pong between ranks 0 and 1, by hand (20 round trips each) ---")
    for nbytes in (8, 2 ** 16, 2 ** 22):
        log(f"{nbytes:>10,} bytes: one-way {ping_pong_by_hand(rank, nbytes) * 1e6:9.1f} us")
    repeats = 5 if args.quick else 20
    log(f"\nmeasured: the same loop timed interleaved over sizes, median of {repeats} samples")
    rows = ping_pong(QUICK_SIZES if args.quick else SIZES, repeats=repeats)
    alpha, beta = fit_alpha_beta([r["bytes"] for r in rows], [r["seconds"] for r in rows])
    log(f"{'bytes':>10} {'one-way':>10} {'min':>10} {'max':>10} {'GB/s':>7} {'alpha+beta*n':>13}")
    for r in rows:
        log(f"{r['bytes']:>10,} {r['seconds'] * 1e6:>8.1f}us {r['min'] * 1e6:>8.1f}us "
            f"{r['max'] * 1e6:>8.1f}us {r['bandwidth'] / 1e9:>7.3f} "
            f"{(alpha + beta * r['bytes']) * 1e6:>11.1f}us")
    log(f"fit: alpha = {alpha * 1e6:.1f} us per message, beta = {beta * 1e9:.3f} ns per byte")
    if beta <= 0:  # the fit keeps beta >= 0: 0 means these sizes could not resolve it
        log("beta ~ 0: the cost of a byte is lost in the noise at these sizes")
    else:
        log(f"({1 / beta / 1e9:.2f} GB/s): a message must be about alpha/beta = "
            f"{alpha / beta:,.0f} bytes before its bytes cost as much as its latency")
    return rows


# DIST_SGD_MINE: a learner's version replaces this one
swap_in(globals(), "ring_sum", ("ring_sum",), lesson="02")


def main():
    args = lesson_parser(__doc__).parse_args()
    launch(run, args.world_size, args, backend=args.backend)


if __name__ == "__main__":
    main()
