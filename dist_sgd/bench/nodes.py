"""Running a measurement inside emulated nodes: what netscale, nettrain and netaccuracy share.

    rank0 = on_nodes("dist_sgd.bench.netscale", nodes=8, quick=False, rate="100mbit")

builds a cluster (dist_sgd.scale.cluster), runs `python -m MODULE --node OUT [--quick]` once in
every node, one rank per node with one thread (what torchrun --nproc-per-node 1 sets), and
returns what rank 0's `work` returned (node_main pickles it into OUT). It then prints what the
run left behind (namespaces or host links that were not there before: "nothing" when all is
well). The links: dist_sgd.scale.cluster's SCALING_RATE and SCALING_BURST unless told others.
"""
import argparse
import os
import pickle
import subprocess
import sys
import tempfile

from dist_sgd.bench.common import Skip
from dist_sgd.scale import cluster, netns


def host_links():
    """The host's interfaces (names): a cluster must leave this list as it found it."""
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return sorted(line.split(":")[1].strip() for line in out.splitlines() if ":" in line)


def on_nodes(module, nodes, quick, rate=cluster.SCALING_RATE, burst=cluster.SCALING_BURST,
             timeout=1800, args=()):
    """Rank 0's result; prints what the cluster left behind. Raises Skip without root."""
    problem = netns.privilege_problem()
    if problem:
        raise Skip(problem)
    before = host_links()
    out = os.path.join(tempfile.mkdtemp(prefix="dist_sgd_nodes_"), "rank0.pkl")
    with cluster.Cluster(nodes, rate=rate, burst=burst) as c:
        names = [c.switch] + c.netns
        cmd = ["env", "RANK=$NODE_RANK", "WORLD_SIZE=$NNODES", "OMP_NUM_THREADS=1",
               sys.executable, "-m", module, "--node", out, *args] + (["--quick"] if quick else [])
        c.run(cmd, timeout=timeout, output=_Quiet())
    left = [n for n in netns.ours() if n in names] + sorted(set(host_links()) - set(before))
    with open(out, "rb") as f:
        result = pickle.load(f)
    os.remove(out)
    os.rmdir(os.path.dirname(out))
    print(f"  left behind by the {nodes}-node cluster: {' '.join(left) or 'nothing'}", flush=True)
    return result


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
