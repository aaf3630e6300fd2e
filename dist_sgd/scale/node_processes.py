"""The processes a Cluster runs in its nodes: started, streamed, waited for, stopped.

The command runs once per node with NODE_RANK, NNODES, MASTER_ADDR (node 0's address),
MASTER_PORT and GLOO_SOCKET_IFNAME=eth0 set; `$NODE_RANK` (etc.) inside its arguments are
replaced per node, and a command given as one string runs through `sh -c`. Output is streamed,
each line prefixed `[node i]`. The exit code is non-zero when a node fails, which is named.

Nodes can come and go while a job runs, as machines do (lesson 17):

    c.start(cmd)               # every node (or nodes=[...]); then c.wait(), c.stop()
    c.remove_node(2)           # its link cut, every process in it SIGKILLed: the machine vanished
    c.add_node(2, cmd)         # the link back up and cmd started there again: a node (re)joins
"""
import os
import re
import signal
import subprocess
import sys
import threading
import time

from dist_sgd.scale import netns


class NodeProcesses:
    """Cluster's running half: what runs in the nodes and how it ends. It uses what Cluster
    builds (n, netns, switch, master_addr, master_port, hostnames) and its _shield()."""

    def env(self, rank):
        """The variables a node's command sees (what a cluster scheduler would set)."""
        return {"NODE_RANK": str(rank), "NNODES": str(self.n), "MASTER_ADDR": self.master_addr,
                "MASTER_PORT": str(self.master_port), "GLOO_SOCKET_IFNAME": netns.IFNAME,
                "TP_SOCKET_IFNAME": netns.IFNAME}

    def argv(self, rank, cmd):
        """The command line that runs `cmd` inside node `rank` (its netns, its own hostname)."""
        env = self.env(rank)
        if isinstance(cmd, str):
            cmd = ["sh", "-c", cmd]  # the shell expands $NODE_RANK itself
        else:
            cmd = [re.sub(r"\$\{?(" + "|".join(env) + r")\}?", lambda m: env[m.group(1)], a)
                   for a in cmd]
        # unshare --uts: a hostname of its own (node0, ...), which /etc/hosts resolves to the
        # node's address, as on a real machine; `ip netns exec` mounts that /etc/hosts.
        return ["ip", "netns", "exec", self.netns[rank], "unshare", "--uts", "--", "sh", "-c",
                'hostname "$0" && exec "$@"', self.hostnames[rank], *cmd]

    def run(self, cmd, env=None, output=None, timeout=None, grace=3.0, check=True):
        """Run `cmd` (a list, or a string for sh -c) once in every node; return the exit codes.

        Output lines are streamed to `output` (default sys.stdout) prefixed `[node i]`. When a
        node fails, the others get `grace` seconds to finish (they usually fail right after it,
        their peer gone), then are stopped. With check=True a failure raises ClusterError
        naming the node that failed first.
        """
        try:
            self.start(cmd, env=env, output=output)
            codes = self.wait(timeout=timeout, grace=grace)
        finally:
            self.stop()
        codes = [codes[r] for r in range(self.n)]
        failed = [r for r in self.order if codes[r] != 0]
        if failed and check:
            raise netns.ClusterError(_failure_message(codes, self.order), failed)
        return codes

    def start(self, cmd, nodes=None, env=None, output=None):
        """Start `cmd` in each of `nodes` (default: all) and return; wait() collects them.
        A node removed before is added back (its link up again)."""
        self._output = output or self._output or sys.stdout
        for rank in range(self.n) if nodes is None else nodes:
            with self._shield():  # started means tracked: stop() will find it
                if rank in self._removed:
                    self._link(rank, "up")
                proc = subprocess.Popen(
                    self.argv(rank, cmd), env=dict(os.environ, **(env or {}), **self.env(rank)),
                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                    start_new_session=True)  # its own process group: we stop it as a whole
                self._procs[rank] = proc
                self._removed.discard(rank)
            reader = threading.Thread(target=_stream, daemon=True,
                                      args=(proc.stdout, rank, self._output, self._lock))
            reader.start()
            self._readers.append(reader)

    def remove_node(self, rank):
        """Node `rank` vanishes, as a reclaimed or crashed machine does: its link is cut first
        (nothing it sends gets out, so peers learn of it only by their own timeouts), then
        every process in it is SIGKILLed. Its exit is expected: wait() does not count it."""
        with self._shield():
            self._removed.add(rank)
            self._link(rank, "down")
            proc = self._procs.get(rank)
            if proc is not None:
                netns.signal_group(proc, signal.SIGKILL)
            netns.kill_inside(self.netns[rank])

    def add_node(self, rank, cmd, env=None):
        """Node `rank` (back, or for the first time) joins: its link up, `cmd` started there."""
        self.start(cmd, nodes=[rank], env=env)

    def _link(self, rank, state):
        for ns, dev in ((self.switch, f"port{rank}"), (self.netns[rank], netns.IFNAME)):
            netns.sh("ip", "-n", ns, "link", "set", dev, state)

    def wait(self, nodes=None, timeout=None, grace=3.0):
        """Wait for the processes of `nodes` (default: every node started and not removed);
        {node: exit code}. After a failure the others get `grace` seconds, then are stopped."""
        nodes = [r for r in (nodes if nodes is not None else sorted(self._procs))
                 if r not in self._removed]
        start, deadline, order, codes = time.monotonic(), None, [], {r: None for r in nodes}
        while None in codes.values():
            for r in nodes:
                p = self._procs[r]
                if r in self._removed and codes[r] is None:
                    codes[r] = "removed"
                    order.append(r)
                if codes[r] is None and p.poll() is not None:
                    codes[r] = p.returncode
                    order.append(r)
                    if p.returncode != 0 and deadline is None:
                        deadline = time.monotonic() + grace
            now = time.monotonic()
            if (deadline is not None and now > deadline) or (timeout and now - start > timeout):
                why = "stopped after the timeout" if deadline is None else "stopped after a failure"
                for r in nodes:
                    if codes[r] is None:
                        codes[r] = f"still running ({why})"
                        order.append(r)
                break
            time.sleep(0.05)
        self.order = order  # the order nodes ended in: the first failure is the likely cause
        return {r: c for r, c in codes.items() if c != "removed"}

    def stop(self):
        """End every process started in the nodes (SIGTERM, then SIGKILL) and their output."""
        with self._shield():
            _stop(list(self._procs.values()), self.netns)
            self._procs = {}
        for reader in self._readers:
            reader.join(timeout=5)
        self._readers = []

    def run_ranks(self, args, timeout=None, output=None):
        """Run `python ARGS` once in every node as one rank of a job: what torchrun
        --nproc-per-node 1 sets (RANK = the node's rank, WORLD_SIZE = nodes, one thread).
        Inside, launch(fn, None, ...) joins the group; node 0's output comes back prefixed."""
        return self.run(["env", "RANK=$NODE_RANK", "WORLD_SIZE=$NNODES", "OMP_NUM_THREADS=1",
                         sys.executable, *args], timeout=timeout, output=output)


def _stream(pipe, rank, output, lock):
    for raw in iter(pipe.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n")
        with lock:
            output.write(f"[node {rank}] {line}\n")
            output.flush()
    pipe.close()


def _stop(procs, names):
    """End every node's process group: SIGTERM, then SIGKILL; then whatever is left inside."""
    alive = [p for p in procs if p.poll() is None]
    for p in alive:
        netns.signal_group(p, signal.SIGTERM)
    end = time.monotonic() + 5
    for p in alive:
        try:
            p.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            netns.signal_group(p, signal.SIGKILL)
            p.wait()
    for p in procs:  # a process that left the group (e.g. a daemon) still sits in the netns
        netns.signal_group(p, signal.SIGKILL)
    for ns in names:
        netns.kill_inside(ns)


def _failure_message(codes, order):
    def how(code):
        if isinstance(code, str):
            return code
        return f"killed by signal {-code}" if code < 0 else f"exit code {code}"

    failed = [r for r in order if codes[r] != 0]
    lines = [f"node {failed[0]} failed first ({how(codes[failed[0]])})"]
    lines += [f"node {r} also failed, probably as a consequence ({how(codes[r])})"
              for r in failed[1:]]
    return "; ".join(lines)
