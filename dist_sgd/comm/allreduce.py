"""The all-reduce algorithms, built on the wire (wire.Link): send/recv alone.

Each algorithm takes a Link, a flat contiguous tensor and an in-place reduce(acc, x), and
leaves in the tensor the reduction of every rank's tensor, the same bytes on every rank. For
p ranks, n bytes, a latency a per message and b seconds per byte (the alpha-beta model):

    naive             everyone -> rank 0, which reduces and sends back   2(p-1)(a + n b)
    tree              binomial tree to rank 0, then back down           2 log2(p) (a + n b)
    ring              reduce-scatter + all-gather over p chunks         2(p-1) a + 2(p-1)/p n b
    halving_doubling  recursive halving + doubling (Rabenseifner)       2 log2(p) a + 2(p-1)/p n b
    ring_pipelined    the ring, with segments in flight (ring_pipelined.py: speed work)

Big messages of the tree's broadcast and of halving-doubling go by rendezvous (wire.py), a
latency more per message. Ring and halving-doubling send ~2n bytes per rank whatever p is (the
least possible); collectives.py reuses the ring's phases for reduce_scatter and all_gather and
the tree for reduce and broadcast. A rank that receives and sends in one step posts the
receive first (wire.Link.start says why).
"""
import torch

from dist_sgd.comm.ring_pipelined import ring_pipelined
from dist_sgd.comm.wire import split

TEXTBOOK = ("naive", "tree", "ring", "halving_doubling")
ALL_REDUCE_ALGORITHMS = TEXTBOOK + ("ring_pipelined",)


# ---- the ring: its two phases are also reduce_scatter and all_gather --------------------------

def ring_reduce_scatter(link, chunks, reduce):
    """p-1 steps around the ring; afterwards chunks[rank] holds the reduction over all ranks.

    `chunks` are p pieces of a working buffer we may overwrite. At step s rank r sends chunk
    (r-s-1) to its right neighbour and adds chunk (r-s-2), arriving from its left, into its
    own copy: each chunk picks up one more rank's contribution per step and, after p-1 steps,
    chunk r is complete at rank r. Every message is one chunk (~n/p elements, maybe empty).
    """
    p, r = link.size, link.rank
    right, left = (r + 1) % p, (r - 1) % p
    inbox = torch.empty(max(c.numel() for c in chunks), dtype=chunks[0].dtype,
                        device=chunks[0].device)
    for step in range(p - 1):
        give, take = (r - step - 1) % p, (r - step - 2) % p
        incoming = inbox[:chunks[take].numel()]
        link.at("reduce-scatter", step).exchange(chunks[give], right, incoming, left, give, take)
        reduce(chunks[take], incoming)  # the chunk we send at the next step


def ring_all_gather(link, chunks):
    """p-1 steps around the ring; rank r starts owning chunks[r] and ends with all of them.

    At step s rank r passes chunk (r-s) on to its right and receives chunk (r-s-1) from its
    left straight into place (no buffer, no copy): the one it passes on at the next step.
    """
    p, r = link.size, link.rank
    right, left = (r + 1) % p, (r - 1) % p
    for step in range(p - 1):
        give, take = (r - step) % p, (r - step - 1) % p
        link.at("all-gather", step).exchange(chunks[give], right, chunks[take], left, give, take)


def ring(link, flat, reduce):
    """Reduce-scatter, then all-gather: 2(p-1) messages per rank, each one chunk of ~n/p."""
    offsets = split(flat.numel(), link.size)
    chunks = [flat[offsets[i]:offsets[i + 1]] for i in range(link.size)]  # views, not copies
    ring_reduce_scatter(link, chunks, reduce)
    ring_all_gather(link, chunks)


# ---- the binomial tree: also reduce and broadcast ---------------------------------------------

def tree_reduce(link, flat, reduce, root=0, inplace=True):
    """Binomial tree: in round k, ranks whose relative rank has bit k set send to the rank 2^k
    below them and drop out; after log2(p) rounds the root holds everything.

    A rank's children are known up front, so it posts all their receives first (each into a
    buffer of its own: they may arrive at once), then adds them in round order, then sends
    the partial result to its parent. Returns the tensor holding this rank's partial result;
    with inplace=False `flat` is left alone and the sum goes into a copy.
    """
    p = link.size
    vr = (link.rank - root) % p
    children, mask = [], 1
    while mask < p and not vr & mask:
        if vr + mask < p:
            children.append(((vr + mask + root) % p, mask.bit_length() - 1))
        mask <<= 1
    bufs = [torch.empty_like(flat) for _ in children]
    recvs = [(b, child, None) for b, (child, _) in zip(bufs, children)]
    requests = link.at("reduce", 0).start(recvs=recvs)
    acc = flat if inplace or not children else flat.clone()
    for request, buf in zip(requests, bufs):
        request.wait()
        reduce(acc, buf)
    if vr != 0:
        link.at("reduce", mask.bit_length() - 1).send(acc, (vr - mask + root) % p)
    return acc


def tree_broadcast(link, flat, root=0):
    """The reduce's tree run backwards: receive once from the parent, then send to children."""
    p = link.size
    vr = (link.rank - root) % p
    mask = 1
    while mask < p and not vr & mask:
        mask <<= 1
    if vr != 0:
        link.at("broadcast", mask.bit_length() - 1).recv(flat, (vr - mask + root) % p,
                                                         rendezvous=True)
    # One child at a time, the biggest subtree first (the textbook order): sent all at once,
    # the sends would share this rank's link, every child would get the tensor only at the
    # end, and the deepest subtree would start last (measured on 16 emulated nodes: 1.5x).
    # A returned send has not arrived (wire.RENDEZVOUS_BYTES): a big one waits for the child's
    # ack before the next child's (16 nodes, 1 MiB: 954 ms without, 689 with; the model 704).
    mask >>= 1
    while mask > 0:
        if vr + mask < p:
            link.at("broadcast", 0).send(flat, (vr + mask + root) % p, rendezvous=True)
        mask >>= 1


def tree(link, flat, reduce):
    tree_reduce(link, flat, reduce, root=0)
    tree_broadcast(link, flat, root=0)


# ---- naive: through rank 0 -------------------------------------------------------------------

def naive(link, flat, reduce):
    """Rank 0 receives every tensor (all receives posted first), reduces them in rank order,
    and sends the result back. It moves 2(p-1) whole tensors while the others wait: the
    bottleneck the other algorithms remove. The others send, then receive into the same
    tensor: posting that receive first would let the result overwrite what is being sent."""
    if link.rank != 0:
        link.at("reduce", 0).send(flat, 0)
        link.at("broadcast", 0).recv(flat, 0)
        return
    bufs = [torch.empty_like(flat) for _ in range(1, link.size)]
    requests = link.at("reduce", 0).start(recvs=[(b, src, None) for src, b in enumerate(bufs, 1)])
    for request, buf in zip(requests, bufs):
        request.wait()
        reduce(flat, buf)
    sends = [(flat, dst, None) for dst in range(1, link.size)]
    for request in link.at("broadcast", 0).start(sends=sends):
        request.wait()


# ---- recursive halving-doubling (Rabenseifner) ----------------------------------------------

def halving_doubling(link, flat, reduce):
    """Halve the data and double the distance each round: log2(p) rounds each way.

    Reduce-scatter by recursive halving: partners 2^k apart swap halves of what they still
    own and reduce the half they keep, so after log2(p) rounds each rank owns one fully
    reduced block of n/p. All-gather by recursive doubling undoes it, swapping ever bigger
    pieces. Both need p to be a power of two, so with p = 2^k + rem the first 2*rem ranks
    fold in pairs first: each even rank hands its whole tensor to the odd rank after it and
    sits out; at the end the odd rank hands the result back (fold-in, fold-out).
    """
    p, r = link.size, link.rank
    p2 = 1 << (p.bit_length() - 1)  # the largest power of two <= p
    rem = p - p2
    if r < 2 * rem:
        if r % 2 == 0:
            link.at("fold-in", 0).send(flat, r + 1)
            link.at("fold-out", 0).recv(flat, r + 1)
            return
        theirs = torch.empty_like(flat)
        link.at("fold-in", 0).recv(theirs, r - 1)
        reduce(flat, theirs)
        nr = r // 2
    else:
        nr = r - rem

    def real(v):  # rank among the p2 survivors -> real rank
        return 2 * v + 1 if v < rem else v + rem

    off = split(flat.numel(), p2)
    inbox = torch.empty(off[p2 // 2] if p2 > 1 else 0, dtype=flat.dtype, device=flat.device)
    lo, hi, mask, step = 0, p2, p2 >> 1, 0
    while mask:
        mid = (lo + hi) // 2
        keep, give = ((mid, hi), (lo, mid)) if nr & mask else ((lo, mid), (mid, hi))
        peer, mine = real(nr ^ mask), flat[off[keep[0]]:off[keep[1]]]
        incoming = inbox[:mine.numel()]
        # rendezvous: the next round's send waits until the partner has all of this one
        # (wire.RENDEZVOUS_BYTES), instead of sharing this rank's link with its tail
        link.at("reduce-scatter", step).exchange(flat[off[give[0]]:off[give[1]]], peer, incoming,
                                                 peer, give, keep, rendezvous=True)
        reduce(mine, incoming)
        lo, hi = keep
        mask, step = mask >> 1, step + 1
    mask, step = 1, 0
    while mask < p2:
        width = hi - lo
        theirs = (lo - width, lo) if nr & mask else (hi, hi + width)
        link.at("all-gather", step).exchange(flat[off[lo]:off[hi]], real(nr ^ mask),
                                             flat[off[theirs[0]]:off[theirs[1]]], real(nr ^ mask),
                                             (lo, hi), theirs, rendezvous=True)
        lo, hi = min(lo, theirs[0]), max(hi, theirs[1])
        mask, step = mask << 1, step + 1
    if r < 2 * rem:
        link.at("fold-out", 0).send(flat, r - 1)


ALGORITHMS = {"naive": naive, "tree": tree, "ring": ring, "halving_doubling": halving_doubling,
              "ring_pipelined": ring_pipelined}
