"""Which rank to blame when ranks fail: the RankError the launcher raises, naming the rank that
most likely caused the others' failures (its own error over a peer's symptom of it), with every
failed rank's traceback; and the words for a deadlock the launcher saw (dist_sgd.plumbing.watch).
"""
import os
import traceback

import torch.distributed as dist

_TORCH_DISTRIBUTED = os.path.dirname(dist.__file__) + os.sep
_OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # dist_sgd/


class RankError(RuntimeError):
    """A rank raised, died or timed out. `.rank` is the rank blamed (the likely cause);
    `.tracebacks` maps every failed rank to its traceback ("" for a rank that died)."""

    def __init__(self, rank, message, tracebacks=None):
        super().__init__(message)
        self.rank = rank
        self.tracebacks = dict(tracebacks or {})


def _from_torch_distributed(exc):
    """Did this exception come out of torch.distributed (a peer vanished or went silent), rather
    than from the rank's own code? Decided by where it was raised, never by its message:
    inside torch.distributed's Python code, or by a native call (work.wait(), a store) made
    from it or from dist_sgd's communication code; DistError is torch's own transport error."""
    if isinstance(exc, dist.DistError):
        return True
    frames = traceback.extract_tb(exc.__traceback__)
    if not isinstance(exc, RuntimeError) or not frames:
        return False  # ValueError, TypeError, ...: a call misused, the rank's own mistake
    where = frames[-1]
    if where.filename.startswith(_TORCH_DISTRIBUTED):
        return True
    native = not (where.line or "").lstrip().startswith("raise")
    return native and where.filename.startswith(_OURS)


# When one rank fails, its peers usually fail a moment later *because* of it: their
# torch.distributed calls report a connection reset (it died) or a timeout (it hangs). Those
# are symptoms. The launcher waits GRACE seconds for every report, then blames, in order:
# a rank whose own code raised, a rank that died, a rank that only reports a symptom.
GRACE = 1.0
_LEVEL = {"error": 0, "died": 1, "symptom": 2}


def _blame(failures):
    """The rank most likely to have caused the others' failures (arrival order breaks ties).
    failures: {rank: (kind, message, traceback)}, in order of arrival."""
    order = list(failures)
    return min(order, key=lambda r: (_LEVEL[failures[r][0]], order.index(r)))


STALLED = "timed out: every rank still running slept"


def stalled_message(ranks, seconds):
    """The RankError's text for a deadlock the launcher saw (see watch.Stall)."""
    names = ", ".join(f"rank {r}" for r in ranks)
    return (f"rank {ranks[0]} failed: {STALLED} for {seconds:g} s ({names}): each waited for a "
            "message no peer sends (a deadlock); the ranks were stopped")


def _returned_early(finished, waiting):
    """Why a collective timed out when no rank failed: a peer left fn without calling it."""
    return [f"rank {r} had already returned from the function while rank {waiting} waited in a "
            f"collective (a collective every rank must call, that rank {r} never called?)"
            for r in finished]


def rank_error(failures, pending=(), finished=()):
    """The RankError for failures ({rank: (kind, message, traceback)}, in order of arrival;
    kind "error" (the rank's own code), "died" or "symptom"): the blamed rank first, the others
    as consequences, the ranks still running (pending) and those done (finished)."""
    blamed = _blame(failures)
    kind, text, tb = failures[blamed]
    lines = [f"rank {blamed} failed: {text}" if kind != "died" else f"rank {blamed} {text}"]
    if kind == "symptom":
        lines += _returned_early(finished, blamed)
    for r, (_, other, _) in failures.items():
        if r != blamed:
            lines.append(f"rank {r} also failed, probably as a consequence: "
                         f"{other.splitlines()[0][:300]}")
    if pending:
        lines.append("still running then (now stopped): "
                     + ", ".join(f"rank {r}" for r in sorted(pending)))
        if kind == "symptom":
            lines.append(f"rank {blamed}'s error came from inside torch.distributed: a peer "
                         "stopped answering. Look at the rank(s) still running, which probably "
                         "hung (or pass a longer timeout for slow work)")
    if tb:
        lines.append(f"--- traceback from rank {blamed} ---\n{tb}")
    return RankError(blamed, "\n".join(lines), {r: f[2] for r, f in failures.items()})
