"""The ring all-reduce, replayed from its trace: as a table of steps, and as an animated GIF.

    trace = []                                  # on every rank:
    all_reduce(torch.ones(8), trace=trace)      # one dict per message this rank sent
    everything = sum(all_traces, [])            # collected on one rank
    for line in table(everything, world_size): print(line)
    draw_gif(everything, world_size, "figures/ring_allreduce.gif")

Nothing here is simulated: replay() rebuilds who holds what purely from the messages the ranks
really sent. Each rank starts with its own contribution to every chunk ({r}); in the
reduce-scatter a received chunk adds the sender's contributions to the receiver's, in the
all-gather it replaces them. After p-1 steps of each, every rank holds every chunk with all p
contributions.
"""
import math

PHASES = ("reduce-scatter", "all-gather")


def replay(trace, world_size):
    """[(phase, step, moves, holdings)] for each step; holdings[r][c] is the frozenset of ranks
    whose contributions rank r holds in chunk c after the step (the first entry: before)."""
    p = world_size
    holdings = [[frozenset([r]) for _ in range(p)] for r in range(p)]
    steps = [("start", -1, [], holdings)]
    # Segments of one chunk are separate messages: one move per (src, dst, chunk) and step.
    moves_at = {}
    for m in trace:
        if m["phase"] in PHASES:
            key = (PHASES.index(m["phase"]), m["step"])
            moves_at.setdefault(key, set()).add((m["src"], m["dst"], m["chunk"]))
    for (phase, step), moves in sorted(moves_at.items()):
        new = [row[:] for row in holdings]
        for src, dst, c in moves:  # every send of a step reads the state before the step
            new[dst][c] = holdings[dst][c] | holdings[src][c] if phase == 0 else holdings[src][c]
        holdings = new
        steps.append((PHASES[phase], step, sorted(moves), holdings))
    return steps


def _who(ranks, p):
    return "all" if len(ranks) == p and p > 2 else "+".join(str(r) for r in sorted(ranks))


def table(trace, world_size):
    """Text lines: for each step, which chunk goes where, then what every rank holds."""
    p = world_size
    width = max(5, len(_who(range(p), p)) + 1, len("+".join(map(str, range(p)))) + 1)
    lines = []
    for phase, step, moves, holdings in replay(trace, p):
        if phase == "start":
            lines.append("before: every rank holds only its own contribution to each chunk")
        else:
            sent = ", ".join(f"r{s}->r{d}: c{c}" for s, d, c in moves)
            lines.append(f"{phase} step {step}: {sent}")
        lines.append("        " + "".join(f"c{c}".ljust(width) for c in range(p)))
        for r in range(p):
            lines.append(f"  rank {r} " + "".join(_who(holdings[r][c], p).ljust(width) for c in range(p)))
    return lines


def draw_gif(trace, world_size, path, frames_per_step=5, fps=6):
    """Draw the ring's steps as an animated GIF at `path`: ranks on a circle, each holding p
    chunk blocks (colour = chunk; shade = how many ranks' contributions it holds, full when
    all p); during a step, the chunks sent travel along the ring to the next rank."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.animation import FuncAnimation, PillowWriter

    p = world_size
    steps = replay(trace, p)
    colours = plt.get_cmap("tab10")
    centre = [(math.cos(math.pi / 2 - 2 * math.pi * r / p), math.sin(math.pi / 2 - 2 * math.pi * r / p))
              for r in range(p)]
    bw = min(0.22, 1.6 / p / 1.2)  # block width: the row of p blocks must fit near its rank

    def block_xy(r, c):
        x, y = centre[r]
        return x + (c - (p - 1) / 2) * bw * 1.1, y

    # Frame list: (index of the step being shown, progress 0..1 of its moving chunks).
    frames = [(0, 1.0)] * 3
    for i in range(1, len(steps)):
        frames += [(i, k / frames_per_step) for k in range(1, frames_per_step + 1)] + [(i, 1.0)] * 2
    frames += [(len(steps) - 1, 1.0)] * 6

    fig, ax = plt.subplots(figsize=(4.2, 4.4), dpi=72)

    def draw(frame):
        i, t = frame
        phase, step, moves, after = steps[i]
        before = steps[i - 1][3] if i > 0 else after
        held = after if t >= 1.0 else before
        ax.clear()
        ax.set_xlim(-1.65, 1.65), ax.set_ylim(-1.6, 1.75), ax.set_aspect("equal"), ax.axis("off")
        ring = plt.Circle((0, 0), 1.0, fill=False, color="0.8", lw=1, ls="--")
        ax.add_patch(ring)
        for r in range(p):
            x, y = centre[r]
            ax.text(x, y + 0.23, f"rank {r}", ha="center", fontsize=8, weight="bold")
            for c in range(p):
                bx, by = block_xy(r, c)
                share = len(held[r][c]) / p
                ax.add_patch(plt.Rectangle((bx - bw / 2, by - bw / 2), bw, bw, color=colours(c % 10),
                                           alpha=0.15 + 0.85 * share, lw=0))
                ax.add_patch(plt.Rectangle((bx - bw / 2, by - bw / 2), bw, bw, fill=False,
                                           lw=2 if share == 1 else 0.5, color="black"))
                ax.text(bx, by - bw / 2 - 0.07, f"c{c}", ha="center", fontsize=6)
        if 0 < t < 1.0:  # chunks in flight, along the straight line between neighbours
            for src, dst, c in moves:
                (x0, y0), (x1, y1) = block_xy(src, c), block_xy(dst, c)
                x, y = x0 + (x1 - x0) * t, y0 + (y1 - y0) * t + 0.35 * math.sin(math.pi * t)
                ax.add_patch(plt.Rectangle((x - bw / 2, y - bw / 2), bw, bw, color=colours(c % 10),
                                           ec="black", lw=1))
        title = ("ring all-reduce: each rank starts with its own data" if phase == "start"
                 else f"{phase}, step {step + 1} of {p - 1}")
        what = {"start": "shade = how many ranks' data a chunk holds",
                "reduce-scatter": "receive a chunk, add it to yours, pass it on",
                "all-gather": "pass the finished chunks around, overwriting"}[phase]
        ax.set_title(f"{title}\n{what}", fontsize=9)
        ax.text(0, -1.5, f"{p} ranks, {p} chunks: each message is one chunk (~n/{p})",
                ha="center", fontsize=7, color="0.3")

    anim = FuncAnimation(fig, draw, frames=frames, interval=1000 / fps)
    anim.save(path, writer=PillowWriter(fps=fps))
    plt.close(fig)
    return path
