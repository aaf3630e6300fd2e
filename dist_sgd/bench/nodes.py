"""Running a measurement inside emulated nodes: what netscale, nettrain and netaccuracy share.

    rank0, left = on_nodes("dist_sgd.bench.netscale", nodes=8, quick=False, rate="100mbit")

builds a cluster (dist_sgd.scale.cluster), runs `python -m MODULE --node OUT [--quick]` once in
every node, one rank per node with one thread (what torchrun --nproc-per-node 1 sets), and
returns what rank 0's `work` returned (node_main pickles it into OUT) and what the run left
behind (namespaces or host links that were not there before: "nothing" when all is well).

The links: RATE each way through tbf with a token bucket of BURST bytes. tbf's default bucket
(128 KiB at 100 Mbit/s) lets a message's first 128 KiB leave at memory speed after any pause:
a 1 MiB ping-pong then runs 8% faster than the link can carry (measured), which is no link at
all. A bucket just above the biggest packet TCP hands a veth (64 KiB, GSO) is the least tbf
can take without cutting packets (a 16-32 KB bucket cut them, and 16 nodes became CPU-bound:
61% of the link, measured): 1 MiB then gains 5%, 4 MiB 1%.
"""
import argparse
import os
import pickle
import subprocess
import sys
import tempfile

import numpy as np

from dist_sgd.scale import cluster

RATE, BURST = "100mbit", 70_000


def host_links():
    """The host's interfaces (names): a cluster must leave this list as it found it."""
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return sorted(line.split(":")[1].strip() for line in out.splitlines() if ":" in line)


PING_PONG = (64, 2 ** 10, 4 * 2 ** 20, 16 * 2 ** 20)  # the sizes fit_alpha_beta needs
QUICK_PING_PONG = (64, 2 ** 10, 2 * 2 ** 20, 4 * 2 ** 20)  # the same, faster


def fit_alpha_beta(rows):
    """(alpha, beta) from ping-pong medians (dicts with "bytes" and "seconds"), each number from
    the sizes that show it: beta = the slope of a line through the messages of >= 2 MiB,
    alpha = the median over messages of <= 1 KiB of their time less their bytes * beta.

    One least-squares line through all sizes would let the small messages' noise (+-50 us on
    a 2-core machine) tilt beta, and the big ones cannot give alpha: after any pause tbf's
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


def link_rate():
    """The links' rate in bytes/s."""
    return cluster.parse_rate(RATE) / 8


def link_goodput(rate_bits, mtu=1500):
    """Bytes/s of TCP payload a link of rate_bits can carry: each frame of mtu + 14 bytes
    (Ethernet header) carries mtu - 52 (IP 20, TCP 20 + 12 of timestamps): 95.6% at 1500."""
    return rate_bits / 8 * (mtu - 52) / (mtu + 14)


def on_nodes(module, nodes, quick, rate=RATE, burst=BURST, timeout=1800, args=()):
    """(rank 0's result, "nothing" or the names left behind); raises common.Skip without root."""
    from dist_sgd.bench import common

    problem = cluster.privilege_problem()
    if problem:
        raise common.Skip(problem)
    before = host_links()
    out = os.path.join(tempfile.mkdtemp(prefix="dist_sgd_nodes_"), "rank0.pkl")
    with cluster.Cluster(nodes, rate=rate, burst=burst) as c:
        names = [c.switch] + c.netns
        cmd = ["env", "RANK=$NODE_RANK", "WORLD_SIZE=$NNODES", "OMP_NUM_THREADS=1",
               sys.executable, "-m", module, "--node", out, *args] + (["--quick"] if quick else [])
        c.run(cmd, timeout=timeout, output=_Quiet())
    left = [n for n in cluster.ours() if n in names] + sorted(set(host_links()) - set(before))
    with open(out, "rb") as f:
        result = pickle.load(f)
    os.remove(out)
    os.rmdir(os.path.dirname(out))
    return result, " ".join(left) or "nothing"


class _Quiet:
    """Node output: node 0's lines pass (progress, errors), the other nodes' only on errors."""

    def write(self, text):
        if text.startswith("[node 0]") or "Error" in text or "Traceback" in text:
            sys.stdout.write(text)

    def flush(self):
        sys.stdout.flush()


def node_main(work, argv):
    """In every node: launch(work, None, quick, *extra) joins the group; rank 0 pickles its
    result to --node OUT. `work(rank, world_size, quick, *extra)` runs on every rank."""
    from dist_sgd.plumbing.launch import launch

    parser = argparse.ArgumentParser()
    parser.add_argument("--node", required=True, help="where rank 0 leaves its result")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("extra", nargs="*")
    a = parser.parse_args(argv)
    results = launch(work, None, a.quick, *a.extra, backend="gloo")
    if results is not None and os.environ.get("RANK") == "0":
        with open(a.node, "wb") as f:
            pickle.dump(results[0], f)
