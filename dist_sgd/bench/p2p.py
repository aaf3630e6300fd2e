"""Figure 2: point-to-point latency and bandwidth by message size, and the fitted alpha, beta.

Ranks 0 and 1 play ping-pong (dist_sgd.comm.p2p.ping_pong): one-way time = half a round trip.
A line t = alpha + beta * n through those times is the whole alpha-beta model: alpha, the
latency of one message, dominates small messages; beta = 1 / bandwidth dominates big ones.
figure 6 (atscale) reuses this fit for "this machine's" network.
"""
import numpy as np

from dist_sgd.plumbing.figures import read_csv, write_csv
from dist_sgd.plumbing.launch import launch
from dist_sgd.scale.costmodel import bandwidth, fit_alpha_beta, human_bytes

NAME = "p2p"


def sizes(quick):
    step = 3 if quick else 1
    return [2 ** k for k in range(3, 27, step)]  # 8 B .. 64 MiB (quick: 8 B .. 32 MiB)


def _worker(rank, world_size, sizes_bytes, repeats):
    from dist_sgd.comm.p2p import ping_pong

    return ping_pong(sizes_bytes, repeats)


def measure(quick=False):
    repeats = 5 if quick else 20
    results = launch(_worker, 2, sizes(quick), repeats, backend="gloo")[0]  # CPU, as every figure
    rows = [{"bytes": int(r["bytes"]), "seconds": r["seconds"], "min": r["min"], "max": r["max"],
             "bandwidth_bytes_per_s": r["bandwidth"], "repeats": repeats} for r in results]
    write_csv(NAME, rows)
    return rows


def fit(rows):
    """(alpha, beta) fitted to the median one-way times of the p2p CSV rows."""
    return fit_alpha_beta([r["bytes"] for r in rows], [r["seconds"] for r in rows])


def load_fit():
    """(alpha, beta, facts) from p2p.csv, or None when it was not measured yet."""
    try:
        rows, facts = read_csv(NAME)
    except FileNotFoundError:
        return None
    return (*fit(rows), facts)


def report(rows):
    alpha, beta = fit(rows)
    print(f"ping-pong between 2 ranks: fit t = alpha + n * beta: alpha = {alpha * 1e6:.1f} us, "
          f"1/beta = {bandwidth(beta) / 1e9:.2f} GB/s")
    print(f"  {'size':>9s} {'one-way':>11s} {'bandwidth':>11s} {'model':>11s} {'error':>7s}")
    for r in rows:
        model = alpha + beta * r["bytes"]
        print(f"  {human_bytes(r['bytes']):>9s} {r['seconds'] * 1e6:9.1f}us "
              f"{r['bytes'] / r['seconds'] / 1e9:7.3f}GB/s {model * 1e6:9.1f}us "
              f"{(model - r['seconds']) / r['seconds']:+7.1%}")


def draw():
    from dist_sgd.bench import plots  # matplotlib: only where we draw (ranks never need it)

    rows, facts = read_csv(NAME)
    alpha, beta = fit(rows)
    n = np.array([r["bytes"] for r in rows], dtype=float)
    t = np.array([r["seconds"] for r in rows])
    lo, hi = np.array([r["min"] for r in rows]), np.array([r["max"] for r in rows])
    fine = np.geomspace(n.min(), n.max(), 200)
    model = alpha + beta * fine

    fig, axes = plots.figure(2)
    ax_t, ax_bw = axes[0]
    ax_t.fill_between(n, lo * 1e6, hi * 1e6, color="tab:blue", alpha=0.2, label="min-max")
    ax_t.plot(n, t * 1e6, "o-", color="tab:blue", label="measured (median)")
    ax_t.plot(fine, model * 1e6, "--", color="black",
              label=f"alpha + n*beta: alpha = {alpha * 1e6:.0f} us, "
                    f"1/beta = {bandwidth(beta) / 1e9:.2f} GB/s")
    plots.bytes_axis(ax_t)
    ax_t.set_yscale("log")
    ax_t.set_xlabel("message size")
    ax_t.set_ylabel("one-way time (us)")
    ax_t.set_title("latency: flat (alpha) for small messages")
    ax_t.legend(fontsize=8)

    ax_bw.fill_between(n, n / hi / 1e9, n / lo / 1e9, color="tab:blue", alpha=0.2, label="min-max")
    ax_bw.plot(n, n / t / 1e9, "o-", color="tab:blue", label="measured (median)")
    ax_bw.plot(fine, fine / model / 1e9, "--", color="black", label="model n / (alpha + n*beta)")
    if beta > 0:
        ax_bw.axhline(1 / beta / 1e9, color="gray", lw=0.8, ls=":", label="1/beta (peak)")
    plots.bytes_axis(ax_bw)
    ax_bw.set_yscale("log")
    ax_bw.set_xlabel("message size")
    ax_bw.set_ylabel("bandwidth (GB/s)")
    ax_bw.set_title("bandwidth: reaches 1/beta for big messages")
    ax_bw.legend(fontsize=8)
    if beta > 0:
        half = alpha / beta  # the size at which latency and transfer cost the same
        for ax in (ax_t, ax_bw):
            ax.axvline(half, color="gray", lw=0.8)
        ax_bw.text(half, ax_bw.get_ylim()[0], f"n1/2 = alpha/beta = {human_bytes(half)} ",
                   fontsize=8, va="bottom", ha="right", color="gray")
    return [plots.finish(fig, NAME, "Point-to-point send/recv between 2 processes (gloo, one host)",
                         facts, note=f"{rows[0]['repeats']} round trips per size; one-way time = "
                                     "round trip / 2; line = least-squares fit on relative error")]
