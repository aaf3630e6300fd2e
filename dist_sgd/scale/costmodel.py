"""The alpha-beta(-gamma) cost model: what a collective *should* cost, on paper.

Sending one message of n bytes costs  alpha + n * beta:
    alpha   latency per message (seconds): software overhead, the network's round trip
    beta    seconds per byte = 1 / bandwidth
    gamma   seconds per byte to *reduce* (add) received data into our own: compute, not wire

Every all-reduce algorithm here costs  a * alpha + n * (b * beta + c * gamma)  for
coefficients (a, b, c) that depend only on the algorithm and the world size p:

    algorithm          a (messages)         b (bytes on the wire / n)   c (bytes added / n)
    naive              2(p-1)               2(p-1)                      p-1
    tree               2 ceil(log2 p)       2 ceil(log2 p)              ceil(log2 p)
    ring               2(p-1)               2(p-1)/p                    (p-1)/p
    ring_pipelined     2(p-1)               2(p-1)/p                    (p-1)/p
    halving_doubling   2 log2 p'  (+2)      2(p'-1)/p'  (+2)            (p'-1)/p'  (+1)
    parameter_server   2p                   2p                          p

Each row, the acks, the fits and the CPU share (cpu=): coefficients(), acks(), predict_all_reduce().
"""
import math

import numpy as np

# what splitting the model costs (lessons 19-20), here too where lessons and tests import it
from dist_sgd.scale.parallel_cost import (STRATEGIES, parallel_bytes,  # noqa: F401
                                          parallel_state_bytes)

ALGORITHMS = ("naive", "tree", "ring", "ring_pipelined", "halving_doubling", "parameter_server")
RENDEZVOUS_BYTES = 64 * 1024  # dist_sgd.comm.wire's (the model imports no torch; a test checks)
ACK_BYTES = 4  # a rendezvous ack: one float32


def _check_world_size(world_size):
    if isinstance(world_size, bool) or not isinstance(world_size, (int, np.integer)) \
            or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")


def steps(algorithm, world_size):
    """The messages on the algorithm's critical path, one after another: ((count, fraction),
    ...), `count` messages of `fraction` * n bytes each. ring: 2(p-1) of n/p; halving-doubling:
    two of n/2, two of n/4, ... (and two whole tensors to fold in the extra ranks); tree: 2
    ceil(log2 p) whole tensors; naive: the root's 2(p-1); parameter server: the server's 2p."""
    _check_world_size(world_size)
    p = int(world_size)
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; choose from {ALGORITHMS}")
    if p == 1:
        return ()
    if algorithm == "naive":
        return ((2 * (p - 1), 1.0),)
    if algorithm == "tree":
        return ((2 * math.ceil(math.log2(p)), 1.0),)
    if algorithm in ("ring", "ring_pipelined"):
        return ((2 * (p - 1), 1.0 / p),)
    if algorithm == "halving_doubling":
        q = 1 << (p.bit_length() - 1)  # largest power of two <= p
        halves = tuple((2, 0.5 ** k) for k in range(1, q.bit_length()))
        return halves + (((2, 1.0),) if q != p else ())  # fold in, hand the result back
    return ((2 * p, 1.0),)  # parameter_server


def acks(algorithm, world_size):
    """The rendezvous acks on the critical path: ((count, fraction), ...), `count` acks each
    after a message of `fraction` * n bytes, sent when that message is RENDEZVOUS_BYTES or
    more. tree: one per broadcast round; halving-doubling: one per exchange (steps' halves).

    Rendezvous (`acks`): a send returns once the kernel holds its bytes, so the tree's broadcast and
    halving-doubling's exchanges follow every message of RENDEZVOUS_BYTES or more with the
    receiver's 4-byte ack before the sender's next message (dist_sgd.comm.wire). Each ack on the
    critical path costs a latency: log2 p of them for the tree, two per halving-doubling round
    whose message is that big. The table above is the textbook's, without them.
    """
    path = steps(algorithm, world_size)
    if algorithm == "tree" and path:
        return ((path[0][0] // 2, 1.0),)
    if algorithm == "halving_doubling":
        return tuple(step for step in path if step[1] < 1.0)  # not the fold-in, fold-out
    return ()


def _acks_sent(algorithm, world_size, nbytes):
    """How many of `acks` an all-reduce of nbytes (a number or an array) waits for."""
    n = np.asarray(nbytes, dtype=np.float64)
    return sum(count * (f * n >= RENDEZVOUS_BYTES) for count, f in acks(algorithm, world_size))


def coefficients(algorithm, world_size):
    """(a, b, c): the all-reduce costs a*alpha + n*(b*beta + c*gamma) seconds for n bytes.
    a and b add up `steps`; c, the bytes added, is half of b for each of them: half of the
    messages on the path carry partial sums to add, the other half the finished result.

    (Hockney 1994; Thakur, Rabenseifner & Gropp 2005 for the collectives below.)
      naive: everybody sends the whole tensor to rank 0, which adds them up one after the other
        and sends the sum back to everybody, one at a time: the root's link carries 2(p-1) n bytes.
      tree: a binomial-tree reduce then a binomial-tree broadcast, ceil(log2 p) rounds each, every
        round moving the whole tensor.
      ring: reduce-scatter then all-gather around a ring, 2(p-1) steps each moving n/p bytes. The
        bytes term 2(p-1)/p n is the least any all-reduce can move, but there are 2(p-1) latencies.
      ring_pipelined: the same ring, each chunk cut into segments so that adding one segment
        overlaps sending the next. Same bytes and steps on paper; the model has no term for the
        overlap (nor for the extra per-segment messages), so it predicts the ring's time.
      halving_doubling (Rabenseifner): recursive-halving reduce-scatter then recursive-doubling
        all-gather among p' = the largest power of two <= p; ring's bandwidth with log2 p'
        latencies. When p is not a power of two, the r = p - p' extra ranks first hand their
        whole tensor to a partner and get the result back at the end: the (+2) and (+1) terms.
      parameter_server: p workers and one separate server that receives every gradient, adds them
        up and sends the result to every worker: the server's link carries 2 p n bytes.

    With p = 1 there is nobody to talk to: every algorithm costs 0.
    Coefficients assume full-duplex links (a send and a receive at the same time cost one
    message) and that steps of different ranks run concurrently. `fit_alpha_beta` turns measured
    (bytes, seconds) into alpha and beta (`fit_shaped_link`: the same on a tbf-shaped emulated
    link); `predict_all_reduce` turns them into a time.
    """
    path = steps(algorithm, world_size)
    a = float(sum(count for count, _ in path))
    b = float(sum(count * fraction for count, fraction in path))
    return a, b, b / 2


def turns(world_size, cores):
    """How many ranks take turns on each core: p / c when p ranks share c < p cores, else 1."""
    _check_world_size(world_size)
    if isinstance(cores, bool) or not isinstance(cores, (int, np.integer)) or cores < 1:
        raise ValueError(f"cores must be a positive integer, got {cores!r}")
    return max(1.0, world_size / cores)


def predict_all_reduce(algorithm, nbytes, world_size, alpha, beta, gamma=0.0, cpu=None):
    """Predicted seconds for one all-reduce of `nbytes` bytes over `world_size` ranks.

    `nbytes` may be a number or an array (numpy broadcasting applies). cpu: None (the link
    alone) or (kappa, per_byte, cores), this machine's share (the module's docstring; fit_cpu).

    The machine's share (`cpu=`): on a cluster every rank has its cores and the link is what a
    step waits for. When p ranks share c < p cores (emulated nodes on one machine), a step of the
    algorithm also needs every rank's CPU work for its message: kappa seconds per message (the
    Python step, gloo, the kernel's TCP, the shaper, waking up) plus per_byte seconds per byte,
    and the p ranks take turns, c at a time. So each step on the critical path (`steps`) costs

        max(alpha + m * beta,  max(1, p / c) * (kappa + m * per_byte))      for its m bytes

    (the link and the CPU work overlap: whichever is longer). kappa and per_byte are measured on
    their own (`fit_cpu`: the CPU seconds a two-rank exchange burns per message), never fitted to
    an all-reduce; with p <= c, or with no `cpu`, the model is the link alone.
    """
    a, b, c = coefficients(algorithm, world_size)
    for name, value in (("alpha", alpha), ("beta", beta), ("gamma", gamma)):
        if not np.all(np.isfinite(value)) or np.any(np.asarray(value) < 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    n = np.asarray(nbytes, dtype=np.float64)
    if np.any(n < 0):
        raise ValueError(f"nbytes must be >= 0, got {nbytes!r}")
    k = _acks_sent(algorithm, world_size, n)
    if cpu is None:
        t = a * alpha + n * (b * beta + c * gamma) + k * (alpha + ACK_BYTES * beta)
    else:
        kappa, per_byte, cores = cpu
        if not all(np.isfinite(v) and v >= 0 for v in (kappa, per_byte)):
            raise ValueError(f"kappa and per_byte must be finite numbers >= 0, got {cpu!r}")
        share = turns(world_size, cores)

        def step(m):  # one message of m bytes on the critical path: its link or its CPU turns
            return np.maximum(alpha + m * beta, share * (kappa + m * per_byte))
        t = n * c * gamma + sum(count * step(f * n) for count, f in steps(algorithm, world_size))
        t = t + k * step(ACK_BYTES)
    t = np.asarray(t, dtype=np.float64)
    return float(t) if t.ndim == 0 else t


def _weighted_fit(columns, target):
    """Least squares on *relative* error: every size counts the same, not just the biggest.

    Solves min sum(((X @ x) - t) / t)^2 with x >= 0 (a negative latency or bandwidth cost
    means the data cannot resolve it: it is set to 0 and the rest refitted).
    """
    X = np.column_stack(columns).astype(np.float64)
    t = np.asarray(target, dtype=np.float64)
    w = 1.0 / t
    free = list(range(X.shape[1]))
    while True:
        x = np.zeros(X.shape[1])
        if free:
            sol, *_ = np.linalg.lstsq(X[:, free] * w[:, None], t * w, rcond=None)
            x[free] = sol
        negative = [j for j in free if x[j] < 0]
        if not negative:
            return x
        free.remove(min(negative, key=lambda j: x[j]))


def _check_samples(nbytes, seconds):
    n = np.asarray(nbytes, dtype=np.float64).ravel()
    t = np.asarray(seconds, dtype=np.float64).ravel()
    if n.shape != t.shape:
        raise ValueError(f"need one time per size: got {n.size} sizes and {t.size} times")
    if n.size < 2 or np.unique(n).size < 2:
        raise ValueError("need measurements at two or more different sizes to fit a line")
    if not (np.all(np.isfinite(n)) and np.all(n >= 0)):
        raise ValueError("sizes must be finite numbers of bytes >= 0")
    if not (np.all(np.isfinite(t)) and np.all(t > 0)):
        raise ValueError("times must be finite numbers of seconds > 0")
    return n, t


def fit_alpha_beta(nbytes, seconds):
    """Fit seconds = alpha + beta * nbytes (one message each); return (alpha, beta).

    The fit minimizes relative error, so 16 KiB and 64 MiB count the same, and keeps both
    numbers >= 0. Bandwidth is 1 / beta bytes per second.
    """
    n, t = _check_samples(nbytes, seconds)
    alpha, beta = _weighted_fit([np.ones_like(n), n], t)
    return float(alpha), float(beta)


def fit_all_reduce(algorithms, nbytes, world_sizes, seconds, gamma=0.0):
    """Fit alpha and beta to measured all-reduce times of any mix of algorithms and world sizes.

    Each measurement i is all-reduce `algorithms[i]` of `nbytes[i]` bytes over
    `world_sizes[i]` ranks taking `seconds[i]`. beta and gamma both multiply the size with the
    same ratio for every algorithm (2:1), so they cannot be told apart from all-reduce times:
    measure gamma on its own (time a local add) and pass it in. Returns (alpha, beta).
    """
    n, t = _check_samples(nbytes, seconds)
    algorithms, world_sizes = list(algorithms), list(world_sizes)
    if not len(algorithms) == len(world_sizes) == n.size:
        raise ValueError("need one algorithm and one world size per measurement")
    coef = np.array([coefficients(a, p) for a, p in zip(algorithms, world_sizes)])
    if np.any(coef[:, 0] == 0):
        raise ValueError("world size 1 does not communicate: nothing to fit there")
    target = t - n * coef[:, 2] * gamma
    if np.any(target <= 0):
        raise ValueError("gamma alone explains more than the measured time: is gamma too big?")
    k = np.array([_acks_sent(a, p, m) for a, p, m in zip(algorithms, world_sizes, n)])
    alpha, beta = _weighted_fit([coef[:, 0] + k, n * coef[:, 1] + k * ACK_BYTES], target)
    return float(alpha), float(beta)


def fit_cpu(rows):
    """(kappa, per_byte) from CPU seconds per message measured at two or more sizes (dicts
    with "bytes" and "seconds", as dist_sgd.comm.p2p.exchange_cpu returns them): the line
    through them on relative error, as fit_alpha_beta's, so every size counts the same. The
    plain least-squares line is set by the biggest messages' cost: measured at 64 B, 64 KiB
    and 1 MiB (356, 1344 and 2268 us per message), its intercept came out at 789 us, 2.2x what
    the 64 B message cost. Both kept >= 0; with no cost per byte seen, the mean per message."""
    if len({r["bytes"] for r in rows}) < 2:
        raise ValueError("the CPU fit needs CPU seconds per message at two or more sizes")
    n = np.array([r["bytes"] for r in rows], dtype=np.float64)
    t = np.array([r["seconds"] for r in rows], dtype=np.float64)
    if not (np.all(np.isfinite(t)) and np.all(t >= 0)):
        raise ValueError("CPU seconds must be finite numbers >= 0")
    w = 1.0 / np.maximum(t, 1e-7)  # a size measured at 0 (all idle) weighs as 0.1 us
    (kappa, per_byte), *_ = np.linalg.lstsq(np.column_stack([w, n * w]), t * w, rcond=None)
    if per_byte <= 0:  # the sizes cannot resolve it: the mean as a cost per message
        return float(t.mean()), 0.0
    if kappa < 0:  # no cost per message seen: the slope through the origin
        return 0.0, float(np.sum(n * t * w ** 2) / np.sum((n * w) ** 2))
    return float(kappa), float(per_byte)


def crossover(first, second, world_size, alpha, beta, cpu=None, low=1.0, high=2.0 ** 34):
    """The message size (bytes) where `second` stops being slower than `first` (second is the
    one that wins on big messages): the smallest n in [low, high] with second(n) <= first(n),
    found on a fine geometric grid; None if never, `low` if at every size."""
    grid = np.geomspace(low, high, 800)
    t1 = predict_all_reduce(first, grid, world_size, alpha, beta, cpu=cpu)
    t2 = predict_all_reduce(second, grid, world_size, alpha, beta, cpu=cpu)
    wins = np.flatnonzero(t2 <= t1 * (1 + 1e-12))
    return None if wins.size == 0 else float(grid[wins[0]])


def shaped_link_sizes(quick=False):
    """The ping-pong sizes fit_shaped_link needs: two of >= 2 MiB (for beta) and some of
    <= 1 KiB (for alpha); quick: smaller big ones, faster."""
    MiB = 2 ** 20
    return (64, 2 ** 10, 2 * MiB, 4 * MiB) if quick else (64, 2 ** 10, 4 * MiB, 16 * MiB)


def fit_shaped_link(rows):
    """(alpha, beta) of a link shaped by tc's tbf (dist_sgd.scale.cluster), from ping-pong
    medians (dicts with "bytes" and "seconds", as dist_sgd.comm.p2p.ping_pong returns them),
    each number from the sizes that show it: beta = the slope of a line through the messages
    of >= 2 MiB, alpha = the median over messages of <= 1 KiB of their time less bytes * beta.

    fit_alpha_beta's one line through all sizes would let the small messages' noise (+-50 us
    on a 2-core machine) tilt beta, and the big ones cannot give alpha: after any pause tbf's
    bucket lets a message's first 70 KB leave at memory speed, which shifts every big message
    by the same 5.8 ms (at 100 Mbit/s) and leaves their slope alone; in between, the bucket is
    most of the message (64 KiB crosses at 3x the link's rate), an artefact no real link has
    and a busy all-reduce never sees.
    """
    big = [r for r in rows if r["bytes"] >= 2 * 2 ** 20]
    small = [r for r in rows if r["bytes"] <= 2 ** 10]
    if len({r["bytes"] for r in big}) < 2 or not small:
        raise ValueError("the fit needs ping-pong medians at two sizes >= 2 MiB and one <= 1 KiB")
    beta = float(np.polyfit([r["bytes"] for r in big], [r["seconds"] for r in big], 1)[0])
    if beta <= 0:
        raise ValueError(f"the big messages give a slope of {beta:.3g} s/byte: not a link")
    alpha = float(np.median([r["seconds"] - r["bytes"] * beta for r in small]))
    return max(alpha, 0.0), beta


def fit_link(rows):
    """fit_shaped_link's (alpha, beta) where the messages of >= 2 MiB show a bandwidth; else
    (loopback, where a few MiB cost about what the noise does, and the big messages' slope
    may come out negative on a busy machine) fit_alpha_beta's line through every size."""
    try:
        return fit_shaped_link(rows)
    except ValueError:
        return fit_alpha_beta([r["bytes"] for r in rows], [r["seconds"] for r in rows])


def bandwidth(beta):
    """Bytes per second of a link costing `beta` seconds per byte (inf when beta is 0: a fit
    that could not resolve the bandwidth from noisy times keeps beta >= 0, so it can be 0)."""
    return 1.0 / beta if beta > 0 else float("inf")


def link(gbit_per_s, latency_us):
    """(alpha, beta) of a network: its bandwidth in Gbit/s and per-message latency in us."""
    if gbit_per_s <= 0 or latency_us < 0:
        raise ValueError("a link needs bandwidth > 0 and latency >= 0")
    return latency_us * 1e-6, 8.0 / (gbit_per_s * 1e9)


def predict_step(compute_s, nbytes, world_size, algorithm, alpha, beta, gamma=0.0,
                 overlap=False):
    """(step seconds, efficiency) of data-parallel SGD with one all-reduce of the gradients.

    No overlap: a step is compute, then communication. Perfect overlap (what DDP's buckets
    aim at): communication hides behind backward, so a step is the longer of the two.
    Efficiency is per-worker throughput against one worker with no communication (weak
    scaling: every worker keeps its own batch).
    """
    comm = predict_all_reduce(algorithm, nbytes, world_size, alpha, beta, gamma)
    step = np.maximum(compute_s, comm) if overlap else compute_s + comm
    return step, compute_s / step


def predict_compressed_step(compute_s, messages, world_size, alpha, beta, compress_s=0.0):
    """Seconds per step with gradient compression (lesson 12) on a network (alpha, beta), ring
    all-reduce, no overlap: compute + compression work + one ring all-reduce per message.
    messages: [(values, bytes per value)], one per all-reduce, as a hook sends them (for ours:
    dist_sgd.ddp.compress.values_sent; PowerSGD pays three latencies where plain all-reduce
    pays one)."""
    comm = sum(predict_all_reduce("ring", values * width, world_size, alpha, beta)
               for values, width in messages)
    return compute_s + compress_s + comm


def bus_bandwidth(nbytes, world_size, seconds):
    """NCCL's "bus bandwidth" of an all-reduce: nbytes * 2(p-1)/p / seconds (bytes/s).

    It divides out ring's own byte count, so a fast all-reduce shows the link's speed at
    every world size; for p = 1 it is 0 (nothing crosses a link).
    """
    _check_world_size(world_size)
    return np.asarray(nbytes, dtype=np.float64) * 2 * (world_size - 1) / world_size / seconds


def human_bytes(n):
    """1024 -> '1 KiB', 3 * 2**20 -> '3 MiB' (for tables and tick labels)."""
    for unit, size in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= size:
            value = n / size
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{n:.0f} B"
