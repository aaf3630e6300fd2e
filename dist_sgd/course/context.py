"""What a case sees inside a rank: its Context (the piece, the expectations that make a failure
one line to act on) and the watch on torch.distributed that counts what the piece sends and
refuses the collectives an exercise must be built without. dist_sgd.course.grade runs the
cases and reports; this is the half that runs inside the ranks."""
from dist_sgd.plumbing.launch import DEFAULT_TIMEOUT

COLLECTIVES = ("all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor",
               "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single",
               "gather", "scatter", "all_gather_object", "broadcast_object_list",
               "gather_object", "scatter_object_list", "barrier")
SENDS, RECEIVES = ("isend", "send"), ("irecv", "recv")


class Failure(AssertionError):
    """A failed expectation: one line (what, where, got, expected, tolerance) and hints."""

    def __init__(self, line, hints=()):
        super().__init__(line)
        self.line, self.hints = line, [h for h in hints if h][:2]



class _Watch:
    """Wraps torch.distributed's functions once per process: while the piece runs they count
    the bytes it sends and the collectives it calls, and refuse the forbidden ones."""

    active, forbid, sent, calls, name, depth, traffic = False, (), 0, None, "", 0, False

    @classmethod
    def install(cls):
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d
        if getattr(c10d, "_dist_sgd_watched", False):
            return
        for fname in COLLECTIVES + SENDS + RECEIVES:
            original = getattr(c10d, fname, None)
            if original is None:
                continue
            wrapper = cls._wrap(fname, original)
            setattr(c10d, fname, wrapper)  # batch_isend_irecv's P2POp checks c10d.isend
            if getattr(dist, fname, None) is original:
                setattr(dist, fname, wrapper)
        c10d._dist_sgd_watched = True

    @classmethod
    def _wrap(cls, fname, original):
        def watched(*args, **kwargs):
            if cls.active:
                cls.traffic = True
            if cls.active and cls.depth == 0:  # send() calls isend(): count the outer call
                if fname in cls.forbid:
                    raise Failure(f"{cls.name} called torch.distributed.{fname}",
                                  [f"build it from isend/irecv (or send/recv) only: no "
                                   f"torch collective inside {cls.name}"])
                if fname in SENDS:
                    tensor = args[0] if args else kwargs["tensor"]
                    cls.sent += tensor.numel() * tensor.element_size()
                cls.calls[fname] = cls.calls.get(fname, 0) + 1
            cls.depth += 1
            try:
                return original(*args, **kwargs)
            finally:
                cls.depth -= 1
        watched.__name__ = watched.__qualname__ = fname
        watched.__wrapped__ = original
        return watched


class Context:
    """What a case sees on its rank: rank, world_size, impl, and the expectations. patience:
    the seconds every rank may wait before the grading calls it a deadlock (a case that waits
    on purpose, for an event that may never come, waits less)."""

    def __init__(self, grader, title, rank, world_size, impl, patience=DEFAULT_TIMEOUT):
        self.grader, self.title, self.patience = grader, title, patience
        self.rank, self.world_size, self.impl = rank, world_size, impl
        self.sent_bytes, self.calls = 0, {}

    def call(self, fn, *args, **kwargs):
        """fn(*args, **kwargs) as the piece: its sends counted (self.sent_bytes), its torch
        calls counted (self.calls), the grader's forbidden collectives refused."""
        _Watch.forbid, _Watch.sent, _Watch.calls = self.grader.forbid, 0, {}
        _Watch.name, _Watch.active = self.grader.exercise.name, True
        try:
            return fn(*args, **kwargs)
        finally:
            _Watch.active = False
            self.sent_bytes, self.calls = _Watch.sent, dict(_Watch.calls)

    def where(self):
        return f"{self.grader.exercise.name}, world size {self.world_size}, rank {self.rank}, " \
               f"{self.title}"

    def fail(self, what, hints=()):
        raise Failure(f"{self.where()}: {what}", hints)

    def expect(self, condition, what, hints=()):
        if not condition:
            self.fail(what, hints)

    def expect_close(self, got, expected, what, atol, rtol=0.0, own=None, hints=()):
        """got == expected within atol + rtol * |expected|, element by element; on the first
        element that is not, a Failure naming it, with the symptom hints that fit."""
        import torch
        if not isinstance(got, torch.Tensor):
            self.fail(f"{what} is {type(got).__name__}, expected a tensor", hints)
        if tuple(got.shape) != tuple(expected.shape):
            self.fail(f"{what} has shape {tuple(got.shape)}, expected {tuple(expected.shape)}",
                      hints)
        if got.dtype != expected.dtype:
            self.fail(f"{what} has dtype {got.dtype}, expected {expected.dtype}", hints)
        g, e = got.detach().cpu().double(), expected.detach().cpu().double()
        bad = ((g - e).abs() > atol + rtol * e.abs()) | (g.isnan() != e.isnan())
        if not bad.any():
            return
        index = [int(i) for i in bad.nonzero()[0]]
        shown = f"element {index[0]}" if len(index) == 1 else f"element {index}"
        tolerance = f"{atol:.0e}" + (f" + {rtol:.0e} x |expected|" if rtol else "")
        a, b = _apart(g[tuple(index)], e[tuple(index)])
        self.fail(f"{what}, {shown} is {a}, expected {b}, a difference of "
                  f"{_num(abs(float(g[tuple(index)]) - float(e[tuple(index)])), 2)} "
                  f"(tolerance {tolerance})",
                  list(hints) + symptoms(g, e, self.world_size, own))

    def everyone(self, obj):
        """Every rank's obj (picklable), in rank order: for comparing ranks after the call."""
        import torch.distributed as dist
        out = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def expect_same_on_every_rank(self, tensor, what, hints=()):
        """Every rank holds the same bytes as rank 0 (call on every rank)."""
        import torch
        mine = tensor.detach().cpu()
        ranks = self.everyone(mine)
        for r, theirs in enumerate(ranks):
            if not torch.equal(theirs, ranks[0]):
                differ = (theirs != ranks[0]).nonzero()[0].tolist()
                if self.rank == r:
                    self.fail(f"{what} differs from rank 0's at element {differ}: "
                              f"{_num(theirs[tuple(differ)], 17)} here, "
                              f"{_num(ranks[0][tuple(differ)], 17)} on rank 0", hints)


def random_input(seed, shape, dtype):
    """A case's input, the same on every run: normal floats, or integers in [-1000, 1000)."""
    import torch
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g, dtype=dtype)
    return torch.randint(-1000, 1000, shape, generator=g, dtype=dtype)


def _num(x, digits=7):
    x = float(x)
    return f"{x:.{digits}g}"


def _apart(got, expected):
    """got and expected with as many digits as it takes to tell them apart (7 at least)."""
    for digits in range(7, 18):
        a, b = _num(got, digits), _num(expected, digits)
        if a != b:
            break
    return a, b


def symptoms(got, expected, world_size, own=None):
    """Hints read off a wrong result: what it equals instead (float64 tensors)."""
    import torch

    def near(a, b):
        return a.shape == b.shape and torch.allclose(a, b, rtol=1e-4, atol=1e-6)

    found = []
    if own is not None:
        own = own.detach().cpu().double()
        if near(got, own) and not near(expected, own):
            found.append("this rank still holds its own values: nothing arrived (received into "
                         "a copy, or the result not written back in place?)")
    p = world_size
    if p > 1 and expected.abs().max() > 0:
        if near(got, expected * p):
            found.append(f"the result is p = {p} times too big: summed but not divided by "
                         "the world size")
        elif near(got, expected / p):
            found.append(f"the result is p = {p} times too small: divided twice (ReduceOp.AVG "
                         "and a division, or averaged on top of a DDP)")
    return found
