"""The four all-reduce algorithms, built on the wire (wire.Link): send/recv alone.

Each algorithm takes a Link and a flat contiguous tensor and leaves in it the reduction of
every rank's tensor, the same bytes on every rank. For p ranks, n bytes, a latency a per
message and b seconds per byte (the alpha-beta model):

    naive             everyone -> rank 0, which reduces and sends back   2(p-1)(a + n b)
    tree              binomial tree to rank 0, then back down           2 log2(p) (a + n b)
    ring              reduce-scatter + all-gather over p chunks         2(p-1) a + 2(p-1)/p n b
    halving_doubling  recursive halving + doubling (Rabenseifner)       2 log2(p) a + 2(p-1)/p n b

Ring and halving-doubling only send pieces: each rank sends ~2n bytes whatever p is (the
least possible). collectives.py, the public API, reuses the ring's phases for
reduce_scatter and all_gather, and the tree for reduce and broadcast.
"""
from .wire import split

ALL_REDUCE_ALGORITHMS = ("naive", "tree", "ring", "halving_doubling")


# ---- the ring: its two phases are also reduce_scatter and all_gather --------------------------

def ring_reduce_scatter(link, chunks, reduce, hand_on=False):
    """p-1 steps around the ring; afterwards chunks[rank] holds the reduction over all ranks.

    `chunks` are p contiguous pieces of a working buffer we may overwrite. At step s rank r
    passes chunk (r-s-1) to its right neighbour and adds the chunk (r-s-2) arriving from its
    left into its own copy, so each chunk picks up one more rank's contribution per step and
    ends, complete, at rank r after p-1 steps. Every message is one chunk (~n/p elements).

    The chunk a rank passes on at step s+1 is the one it reduces at step s, so each segment
    leaves as soon as it is reduced: big chunks flow through the ring like a pipeline
    instead of stopping at every rank. hand_on=True also passes on the finished chunk: the
    first send of the all-gather that follows.
    """
    p, r = link.size, link.rank
    right, left = (r + 1) % p, (r - 1) % p
    if p > 1:
        link.at("reduce-scatter", 0).isend(chunks[(r - 1) % p], right, chunk=(r - 1) % p)
    for step in range(p - 1):
        d = (r - step - 2) % p
        after = ("reduce-scatter", step + 1) if step < p - 2 else ("all-gather", 0) if hand_on else None

        def pass_on(piece, d=d, after=after):
            link.isend(piece, right, chunk=d, where=after)
        link.at("reduce-scatter", step).exchange_reduce(None, None, chunks[d], left, reduce,
                                                        recv_chunk=d, reduced=after and pass_on)


def ring_all_gather(link, chunks, started=False):
    """p-1 steps around the ring; rank r starts owning chunks[r] and ends with all of them.

    At step s rank r receives chunk (r-s-1) from its left straight into place (no buffer,
    no copy) and passes each segment on to its right as soon as it is in. started=True:
    the reduce-scatter already sent chunks[r] (hand_on).
    """
    p, r = link.size, link.rank
    right, left = (r + 1) % p, (r - 1) % p
    if p > 1 and not started:
        link.at("all-gather", 0).isend(chunks[r], right, chunk=r)
    for step in range(p - 1):
        d = (r - step - 1) % p
        link.flush(chunk=d)  # the reduce-scatter sent this chunk: that send must be over
        pieces = link.cut(chunks[d])
        for piece, work in zip(pieces, link.at("all-gather", step).irecv(chunks[d], left, chunk=d)):
            work.wait()
            if step < p - 2:
                link.isend(piece, right, chunk=d, where=("all-gather", step + 1))


def ring(link, flat, reduce):
    offsets = split(flat.numel(), link.size)
    chunks = [flat[offsets[i]:offsets[i + 1]] for i in range(link.size)]  # views, not copies
    ring_reduce_scatter(link, chunks, reduce, hand_on=True)
    ring_all_gather(link, chunks, started=True)


# ---- the binomial tree: also reduce and broadcast ---------------------------------------------

def tree_reduce(link, flat, reduce, root=0, inplace=True):
    """Binomial tree: in round k, ranks whose relative rank has bit k set send to the rank 2^k
    below them and drop out; after log2(p) rounds the root holds everything.

    Returns the tensor holding this rank's partial result. With inplace=False `flat` is left
    alone: the first child's contribution goes into a copy (leaves never make one).
    """
    p = link.size
    vr = (link.rank - root) % p
    acc, mask, step = flat, 1, 0
    while mask < p:
        if vr & mask:
            link.at("reduce", step).isend(acc, (vr - mask + root) % p)
            break
        if vr + mask < p:
            if acc is flat and not inplace:
                acc = flat.clone()
            link.at("reduce", step).exchange_reduce(None, None, acc, (vr + mask + root) % p, reduce)
        mask, step = mask << 1, step + 1
    return acc


def tree_broadcast(link, flat, root=0):
    """The reduce's tree run backwards: receive once from the parent, then send to children."""
    p = link.size
    vr = (link.rank - root) % p
    mask = 1
    while mask < p:
        if vr & mask:
            link.at("broadcast", mask.bit_length() - 1).recv(flat, (vr - mask + root) % p)
            break
        mask <<= 1
    mask >>= 1
    while mask > 0:
        if vr + mask < p:
            link.at("broadcast", mask.bit_length() - 1).isend(flat, (vr + mask + root) % p)
        mask >>= 1


def tree(link, flat, reduce):
    tree_reduce(link, flat, reduce, root=0)
    link.flush()  # the broadcast overwrites what the reduce sent
    tree_broadcast(link, flat, root=0)


# ---- naive: through rank 0 -------------------------------------------------------------------

def naive(link, flat, reduce):
    """Rank 0 receives every tensor in rank order, reduces, and sends the result back.

    Rank 0 moves 2(p-1) whole tensors while the others wait: the bottleneck the other
    algorithms remove.
    """
    if link.rank != 0:
        link.at("reduce", 0).isend(flat, 0)
        link.flush()
        link.at("broadcast", 0).recv(flat, 0)
        return
    for src in range(1, link.size):
        link.at("reduce", src - 1).exchange_reduce(None, None, flat, src, reduce)
    for dst in range(1, link.size):
        link.at("broadcast", dst - 1).isend(flat, dst)


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
            link.at("fold-in", 0).isend(flat, r + 1)
            link.flush()
            link.at("fold-out", 0).recv(flat, r + 1)
            return
        link.at("fold-in", 0).exchange_reduce(None, None, flat, r - 1, reduce)
        nr = r // 2
    else:
        nr = r - rem

    def real(v):  # rank among the p2 survivors -> real rank
        return 2 * v + 1 if v < rem else v + rem

    off = split(flat.numel(), p2)
    lo, hi, mask, step = 0, p2, p2 >> 1, 0
    while mask:
        mid = (lo + hi) // 2
        keep, give = ((mid, hi), (lo, mid)) if nr & mask else ((lo, mid), (mid, hi))
        peer = real(nr ^ mask)
        link.at("reduce-scatter", step).exchange_reduce(flat[off[give[0]]:off[give[1]]], peer,
                                                        flat[off[keep[0]]:off[keep[1]]], peer,
                                                        reduce, give, keep)
        lo, hi = keep
        mask, step = mask >> 1, step + 1
    link.flush()  # the all-gather overwrites the halves given away
    mask, step = 1, 0
    while mask < p2:
        width = hi - lo
        theirs = (lo - width, lo) if nr & mask else (hi, hi + width)
        link.at("all-gather", step).exchange(flat[off[lo]:off[hi]], real(nr ^ mask),
                                             flat[off[theirs[0]]:off[theirs[1]]], real(nr ^ mask),
                                             (lo, hi), theirs)
        lo, hi = min(lo, theirs[0]), max(hi, theirs[1])
        mask, step = mask << 1, step + 1
    if r < 2 * rem:
        link.at("fold-out", 0).isend(flat, r - 1)


ALGORITHMS = {"naive": naive, "tree": tree, "ring": ring, "halving_doubling": halving_doubling}
