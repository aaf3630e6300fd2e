"""Elastic runs on the emulated nodes (lesson 17's plumbing): torchrun's command, a store of its
own, a sink that keeps the nodes' output lines, and one run with a node removed (and added
back) while it trains, measured.

    cmd = torchrun_elastic(["lessons/17_elastic.py", "--checkpoint-dir", d], "node0:29400")
    with Cluster(4) as cluster:
        watch = Watch()                              # a Cluster output sink
        rows = run_act(cluster, watch, cmd, nodes=range(3), lost=2, folder=d, size=2,
                       back=True)                    # what each change cost, one row each

The training script must print `world size W: resumed from step S ... (reload T s)` when it
starts from a checkpoint, `step N at world size W` at each checkpoint, and write the step it
reached into FOLDER/progress (dist_sgd.faults.chaos.write_step): that is what is watched.

How torchrun's elastic mode meets, restarts and fails, and why the store belongs on a machine
of its own: torchrun_elastic()'s docstring.
"""
import argparse
import datetime
import os
import re
import sys
import threading
import time

from dist_sgd.faults.chaos import read_step

# Shortened (torch's defaults in DEFAULTS): the survivors meet again within seconds.
RDZV_CONF = {"last_call_timeout": 1, "keep_alive_interval": 1, "keep_alive_max_attempt": 3,
             "join_timeout": 120, "read_timeout": 10}
DEFAULTS = {"last_call_timeout": 30, "keep_alive_interval": 5, "keep_alive_max_attempt": 3,
            "join_timeout": 600, "read_timeout": 60}
# torch 2.14.1's restart hang: every rendezvous round in a fresh store (dist_sgd.faults.restarts).
ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "OMP_NUM_THREADS": "1"}


def torchrun_elastic(script_args, endpoint, nnodes="2:3", max_restarts=3, conf=None,
                     run_id="elastic"):
    """The command every node runs: one worker per node, elastic between nnodes' bounds.

    torchrun's elastic mode: `--nnodes MIN:MAX` and a c10d rendezvous, a key-value store that the
    node whose address is the --rdzv-endpoint hosts inside its torchrun agent. A node that joins
    while the job runs waits; the running agents see it (num_nodes_waiting) and restart their
    workers to meet again with it; torch 2.14.1 does not count that as a restart. A node that
    vanishes makes its peers' next collective fail (after their timeout, when nothing told them);
    their workers fail, which does count against --max-restarts, and the agents meet again
    without it once its heartbeats have stopped for keep_alive_interval x keep_alive_max_attempt.
    RDZV_CONF shortens torch's defaults (DEFAULTS) so that a lesson's run takes seconds, not
    minutes; real jobs keep longer values, which tolerate slow machines.

    The store's host is the weak point: when the node that hosts the c10d store vanishes, every
    other agent loses the rendezvous. Measured on the emulated nodes (a vanished host sends no
    reset, so a TCP request to it never returns): the workers fail at their next collective, but
    the agents stay blocked in DynamicRendezvousHandler.num_nodes_waiting, a store request to the
    lost host, so the job neither goes on nor ends until something stops it. The remedy is a store
    that outlives any training node: `python -m dist_sgd.faults.elastic --store PORT` hosts one on
    a machine of its own (what an etcd server, or torchrun's `--rdzv-backend etcd-v2`, gives a real
    cluster), and every node's --rdzv-endpoint names it.
    """
    conf = {**RDZV_CONF, **(conf or {})}
    return (["env"] + [f"{k}={v}" for k, v in ENV.items()] +
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", nnodes,
             "--nproc-per-node", "1", "--max-restarts", str(max_restarts),
             "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", run_id,
             "--rdzv-conf", ",".join(f"{k}={v}" for k, v in conf.items()),
             "--monitor-interval", "0.2", *script_args])


def shown(cmd):
    """cmd as a learner would type it: `env A=1 python -m torch.distributed.run` -> torchrun."""
    words = [w for w in cmd if w != "env"]
    text = " ".join(words).replace(f"{sys.executable} -m torch.distributed.run", "torchrun")
    return text.replace(f"{sys.executable} ", "python ")


class Watch:
    """An output sink for Cluster: keeps every line with its arrival time (time.monotonic()),
    echoes those that match `echo` (a regex; None: all), and waits for a line on request."""

    def __init__(self, echo=None, out=sys.stdout):
        self.lines, self.echo, self.out = [], echo and re.compile(echo), out
        self._changed, self._partial = threading.Condition(), ""

    def write(self, text):
        with self._changed:
            *done, self._partial = (self._partial + text).split("\n")
            for line in done:
                self.lines.append((time.monotonic(), line))
                if self.echo is None or self.echo.search(line):
                    self.out.write(line + "\n")
                    self.out.flush()
            self._changed.notify_all()

    def flush(self):
        pass

    def wait_for(self, pattern, since=0.0, timeout=300, until=None):
        """(time, match) of the first line after `since` that matches `pattern` (and for which
        until(match) is true); TimeoutError after `timeout` seconds."""
        regex, deadline = re.compile(pattern), time.monotonic() + timeout
        with self._changed:
            seen = 0
            while True:
                for t, line in self.lines[seen:]:
                    m = regex.search(line)
                    if t >= since and m and (until is None or until(m)):
                        return t, m
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no line matching {pattern!r} within {timeout} s")
                self._changed.wait(min(left, 1.0))

    def since(self, t, pattern):
        """Every line after time t that matches pattern."""
        return [line for s, line in self.lines if s >= t and re.search(pattern, line)]


def membership_change(cluster, watch, node, progress, cmd=None, size=None, timeout=300):
    """Remove `node` from the running job (or add it, running cmd), then wait until the job
    resumes at world size `size` (None: it is not expected to). Returns what it cost: the
    step reached at the change (from the progress file), the step resumed from, the steps
    repeated (from the step the workers stopped at), the seconds from the change to the
    resumed line, and the reload time that line reports."""
    done, t0 = read_step(progress), time.monotonic()
    cluster.add_node(node, cmd) if cmd else cluster.remove_node(node)
    row = {"change": f"node {node} {'added' if cmd else 'removed'}", "after_step": done,
           "world_size": size or "", "resumed": "", "repeated": "", "seconds": "", "reload_s": "",
           "exit": "", "distance": "", "at": t0}
    if size is not None:
        t, m = watch.wait_for(rf"world size {size}: resumed from step (\d+).*reload ([\d.]+) s",
                              since=t0, timeout=timeout)
        # the step reached when the workers stopped (a node that joins is waited for while
        # training goes on): the progress file still holds it when the resumed line comes
        reached = max(done, read_step(progress))
        row.update(resumed=int(m.group(1)), repeated=reached - int(m.group(1)),
                   seconds=round(t - t0, 1), reload_s=float(m.group(2)))
    return row


def sizes_over_steps(rows, world_size, steps):
    """The world sizes a job ran at, [(size, until step), ...], from its membership changes'
    rows (each resumed at its world_size from its step) and the size it started at."""
    changes = [(r["world_size"], r["resumed"]) for r in rows]
    ends = [step for _, step in changes] + [steps]
    return [(world_size, ends[0])] + [(size, end) for (size, _), end in zip(changes, ends[1:])]


def run_act(cluster, watch, cmd, nodes, lost, folder, size, back=False, store=None,
            port=29400, after=20, give_up=60, timeout=300):
    """Start cmd in `nodes` (and a store of its own in node `store`, if given), remove node
    `lost` once step `after` is saved at full size, and wait for the job to resume at world
    size `size` (None: it is not expected to); with back=True, add the node back once a step
    has passed there and wait for the full size again. Then wait for the nodes to finish
    (give_up seconds when the job is not expected to go on) and stop everything in them.
    Returns the rows of membership_change, the last one with every node's exit."""
    full, progress, t0 = len(nodes), os.path.join(folder, "progress"), time.monotonic()
    if store is not None:
        cluster.start(store_command(port), nodes=[store], output=watch)
    cluster.start(cmd, nodes=nodes, output=watch)
    watch.wait_for(rf"step (\d+) at world size {full}", t0, timeout,
                   until=lambda m: int(m[1]) >= after)
    rows = [membership_change(cluster, watch, lost, progress, size=size, timeout=timeout)]
    if back:  # a few steps on fewer nodes, then the lost node comes back
        watch.wait_for(rf"step (\d+) at world size {size}", rows[-1]["at"], timeout,
                       until=lambda m: int(m[1]) > rows[-1]["resumed"])
        rows.append(membership_change(cluster, watch, lost, progress, cmd, full, timeout))
    codes = cluster.wait(nodes=nodes, timeout=timeout if size else give_up)  # not the removed
    rows[-1]["exit"] = " ".join(f"node {n}: {code}" for n, code in codes.items())
    if size is None:  # how long the job was seen neither going on nor ending
        rows[-1]["seconds"] = round(time.monotonic() - rows[-1]["at"], 1)
    cluster.stop()
    return rows


def store_command(port):
    """What the store's own machine runs (see host_store)."""
    return [sys.executable, "-m", "dist_sgd.faults.elastic", "--store", str(port)]


def host_store(port, seconds=3600):
    """Host a TCPStore on every address of this machine at `port` until killed: the rendezvous
    store of a job whose training nodes may all come and go."""
    import torch.distributed as dist  # noqa: PLC0415 - only the store host needs torch
    store = dist.TCPStore("0.0.0.0", port, is_master=True, wait_for_workers=False,
                          multi_tenant=True, timeout=datetime.timedelta(seconds=seconds))
    print(f"store listening on port {port}", flush=True)
    time.sleep(seconds)
    return store


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m dist_sgd.faults.elastic",
                                     description="host a rendezvous store on this machine")
    parser.add_argument("--store", type=int, required=True, metavar="PORT")
    host_store(parser.parse_args(argv).store)


if __name__ == "__main__":
    main()
