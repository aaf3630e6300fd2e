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
    """[(phase, step, moves, holdings)] for each step: moves = [(src, dst, chunk, bytes)];
    holdings[r][c] is the frozenset of ranks whose contributions rank r holds in chunk c
    after the step (the first entry: before any step)."""
    p = world_size
    holdings = [[frozenset([r]) for _ in range(p)] for r in range(p)]
    steps = [("start", -1, [], holdings)]
    # Segments of one chunk are separate messages: one move per (src, dst, chunk) and step.
    moves_at = {}
    for m in trace:
        if m["phase"] in PHASES:
            key = (PHASES.index(m["phase"]), m["step"])
            move = (m["src"], m["dst"], m["chunk"])
            moves_at.setdefault(key, {})[move] = moves_at.get(key, {}).get(move, 0) + m["nbytes"]
    for (phase, step), moves in sorted(moves_at.items()):
        new = [row[:] for row in holdings]
        for src, dst, c in moves:  # every send of a step reads the state before the step
            new[dst][c] = holdings[dst][c] | holdings[src][c] if phase == 0 else holdings[src][c]
        holdings = new
        steps.append((PHASES[phase], step, sorted(k + (b,) for k, b in moves.items()), holdings))
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
            sent = ", ".join(f"r{s}->r{d}: c{c} ({b} B)" for s, d, c, b in moves)
            lines.append(f"{phase} step {step}: {sent}")
        lines.append("         " + "".join(f"c{c}".ljust(width) for c in range(p)))
        for r in range(p):
            cells = "".join(_who(holdings[r][c], p).ljust(width) for c in range(p))
            lines.append(f"  rank {r} " + cells)
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
    angle = [math.pi / 2 - 2 * math.pi * r / p for r in range(p)]  # rank 0 on top, clockwise
    bw = min(0.22, 1.5 / p / 1.1)  # block width: a rank's row of p blocks must fit by its place

    def block_xy(r, c, a=None):  # where rank r keeps chunk c (or, in flight, at angle a)
        a = angle[r] if a is None else a
        return math.cos(a) + (c - (p - 1) / 2) * bw * 1.1 - bw / 2, math.sin(a) - bw / 2

    # Frame list: (index of the step being shown, progress 0..1 of its moving chunks).
    frames = [(0, 1.0)] * 3
    for i in range(1, len(steps)):
        frames += [(i, k / frames_per_step) for k in range(1, frames_per_step)] + [(i, 1.0)] * 3
    frames += [(len(steps) - 1, 1.0)] * 6

    fig, ax = plt.subplots(figsize=(4.2, 4.4), dpi=72)
    ax.set_xlim(-1.65, 1.65), ax.set_ylim(-1.6, 1.75), ax.set_aspect("equal"), ax.axis("off")
    ax.add_patch(plt.Circle((0, 0), 1.0, fill=False, color="0.8", lw=1, ls="--"))
    # Artists made once and updated per frame: redrawing from scratch is several times slower.
    blocks = {}
    for r in range(p):
        ax.text(math.cos(angle[r]), math.sin(angle[r]) + 0.24, f"rank {r}", ha="center",
                fontsize=8, weight="bold")
        for c in range(p):
            x, y = block_xy(r, c)
            blocks[r, c] = ax.add_patch(plt.Rectangle((x, y), bw, bw, fc=colours(c % 10),
                                                      ec="black"))
            ax.text(x + bw / 2, y - 0.08, f"c{c}", ha="center", fontsize=6)
    flying = [ax.add_patch(plt.Rectangle((0, 0), bw, bw, ec="black", lw=1, visible=False))
              for _ in range(p)]
    title = ax.set_title("", fontsize=9)
    ax.text(0, -1.5, f"{p} ranks, {p} chunks: each message is one chunk (~n/{p})",
            ha="center", fontsize=7, color="0.3")
    explain = {"start": "shade = how many ranks' data a chunk holds",
               "reduce-scatter": "receive a chunk, add it to yours, pass it on",
               "all-gather": "pass the finished chunks around, overwriting"}

    def draw(frame):
        i, t = frame
        phase, step, moves, after = steps[i]
        held = after if t >= 1.0 else steps[i - 1][3]
        for (r, c), patch in blocks.items():
            share = len(held[r][c]) / p
            patch.set_alpha(0.15 + 0.85 * share)
            patch.set_linewidth(2 if share == 1 else 0.5)
        for k, patch in enumerate(flying):  # chunks in flight travel along the ring
            patch.set_visible(0 < t < 1.0 and k < len(moves))
            if patch.get_visible():
                src, dst, c, _ = moves[k]
                turn = (angle[dst] - angle[src] + math.pi) % (2 * math.pi) - math.pi  # short way
                patch.set_xy(block_xy(src, c, angle[src] + turn * t))
                patch.set_facecolor(colours(c % 10))
        head = ("ring all-reduce: each rank starts with its own data" if phase == "start"
                else f"{phase}, step {step + 1} of {p - 1}")
        title.set_text(f"{head}\n{explain[phase]}")

    anim = FuncAnimation(fig, draw, frames=frames, interval=1000 / fps)
    anim.save(path, writer=PillowWriter(fps=fps))
    plt.close(fig)
    return path
