"""Several "nodes" on one machine: network namespaces joined by a switch, links of a chosen speed.

    sudo python -m dist_sgd.scale.cluster --nodes 2 --rate 1gbit -- \\
        'torchrun --nnodes $NNODES --node-rank $NODE_RANK --nproc-per-node 1 \\
                  --master-addr $MASTER_ADDR --master-port $MASTER_PORT \\
                  lessons/07_ddp_from_scratch.py'

    with Cluster(2, rate="1gbit") as cluster:          # the same from Python
        cluster.run([sys.executable, "train.py"])      # once in every node; raises if one fails

A Linux network namespace gives a process its own network stack, which is what a separate
machine looks like from the network's side: each node is one, behind a veth to a bridge in a
"switch" namespace, every link shaped by tbf to RATE each way (the layout, and how a Ctrl-C
is held until a step is done: Cluster's docstring). What runs in the nodes: node_processes.py.
Names carry the pid (dsgd<pid>n0, ...) and the subnet is derived from it, so runs never collide.
Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and iproute2's `ip` and `tc`.
"""
import argparse
import contextlib
import os
import random
import re
import shlex
import signal
import sys
import threading

from dist_sgd.scale import netns
from dist_sgd.scale.node_processes import NodeProcesses, _failure_message

_RATE = re.compile(r"^\s*([0-9.]+)\s*([kmgt]?)(bit|bps)?\s*$", re.IGNORECASE)

# The links lesson 10 and the benchmark's network parts scale on: SCALING_RATE each way through
# tbf with a token bucket of SCALING_BURST bytes. tbf's default bucket (128 KiB at 100 Mbit/s)
# lets a message's first 128 KiB leave at memory speed after any pause: a 1 MiB ping-pong then
# runs 8% faster than the link can carry (measured), which is no link at all. A bucket just
# above the biggest packet TCP hands a veth (64 KiB, GSO) is the least tbf can take without
# cutting packets (a 16-32 KB bucket cut them, and 16 nodes became CPU-bound: 61% of the link,
# measured): 1 MiB then gains 5%, 4 MiB 1%.
SCALING_RATE, SCALING_BURST = "100mbit", 70_000


def parse_rate(rate):
    """'1gbit' -> 1e9 bits/s ('100mbit', '500kbit', '2.5gbit'; tc's 'mbps' means megabytes/s)."""
    m = _RATE.match(str(rate))
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"rate must look like 1gbit, 100mbit or 500kbit, got {rate!r}")
    scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m.group(2).lower()]
    bits = float(m.group(1)) * scale * (8 if (m.group(3) or "").lower() == "bps" else 1)
    return bits


def link_goodput(rate_bits, mtu=1500):
    """Bytes/s of TCP payload a link of rate_bits can carry: each frame of mtu + 14 bytes
    (Ethernet header) carries mtu - 52 (IP 20, TCP 20 + 12 of timestamps): 95.6% at 1500."""
    return rate_bits / 8 * (mtu - 52) / (mtu + 14)


def run_in_nodes(args, nodes=2, rate="1gbit", timeout=None):
    """`python ARGS` once in every node of a fresh cluster, one rank each (Cluster.run_ranks).
    Returns None, or without the privilege the sentence saying why nothing ran."""
    problem = netns.privilege_problem()
    if problem is None:
        with Cluster(nodes, rate=rate) as c:
            c.run_ranks(args, timeout=timeout)
    return problem


class Cluster(NodeProcesses):
    """N network-namespace nodes behind one bridge, each link shaped to `rate` (None: unshaped).

    A context manager: `with Cluster(2, "1gbit") as c:` builds it, the end of the block removes
    every namespace, link, qdisc and file it made, whatever happened inside.

    On one machine the "network" between processes is the CPU copying bytes through loopback: no
    link to saturate, nothing to overlap. A Linux network namespace gives a process its own network
    stack (interfaces, addresses, routes, ports), which is what a separate machine looks like from
    the network's side. Cluster builds a small cluster out of them:

        node 0 (netns) eth0 10.a.b.1 --veth-- port0 \\
        node 1 (netns) eth0 10.a.b.2 --veth-- port1  >- br0, a bridge in its own "switch" netns
        ...                                         /

    Each node's eth0 sends through a token-bucket filter (`tc qdisc ... tbf rate RATE`), and so does
    the switch port towards it: every node has a RATE link in each direction, like a switch port,
    and its TCP runs cubic (netns.CONGESTION_CONTROL: Linux's default, whatever this host's is). The
    nodes share the machine's files and CPUs (so one checkout serves every node) but not its
    network: they reach each other and nothing else (no default route, no NAT, no address outside
    this run; the host's own interfaces are never touched). Each node also gets its own hostname
    (node0, ...) and an /etc/hosts naming every node, so torchrun's c10d rendezvous finds its host
    node as on a real cluster. Everything made (namespaces, veth links, bridge, qdiscs,
    /etc/netns/<name>) is removed at the end, also after Ctrl-C, SIGTERM or a failing node;
    `--cleanup` removes what a SIGKILLed run left. A Ctrl-C (or SIGTERM) that lands while the
    cluster is being built, while a node's process is being started, or while it is being removed,
    takes effect right after that step (a namespace made is always recorded, a process started
    always tracked, a teardown never cut short); a second one in the same step acts at once.
    """

    def __init__(self, nodes, rate=None, mtu=1500, burst=None,
                 congestion_control=netns.CONGESTION_CONTROL):
        if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= 250:
            raise ValueError(f"nodes must be a whole number from 1 to 250, got {nodes!r}")
        self.n, self.mtu = nodes, mtu
        self.rate_bits = None if rate is None else parse_rate(rate)
        self.rate, self.burst = rate, burst
        self.congestion_control = congestion_control  # None: the host's
        pid = os.getpid()
        self.run_id = f"{netns.PREFIX}{pid}"
        # A subnet per run (10.x.y.0/24 from the pid): no two live runs share one. They could
        # not meet anyway (separate switches), but distinct addresses keep logs unambiguous.
        self.subnet = f"10.{100 + (pid >> 8) % 150}.{pid % 256}"
        self.netns = [f"{self.run_id}n{i}" for i in range(nodes)]
        self.switch = f"{self.run_id}sw"
        self.addresses = [f"{self.subnet}.{i + 1}" for i in range(nodes)]
        self.hostnames = [f"node{i}" for i in range(nodes)]
        # The namespaces are new and empty, so any port is free in node 0; this range stays
        # clear of the ephemeral ports (32768+) that the nodes' own connections will use.
        self.master_port = random.randint(20000, 32000)
        self._made = []
        self._old_handlers = {}
        self._shielded, self._pending = 0, None  # see _shield()
        self._procs, self._readers, self._removed = {}, [], set()
        self._lock, self._output = threading.Lock(), None

    @property
    def master_addr(self):
        return self.addresses[0]

    # -- building and removing -------------------------------------------------------------
    def __enter__(self):
        self.up()
        return self

    def __exit__(self, *exc):
        self.down()

    def up(self):
        self._catch_signals()
        try:
            with self._shield():
                problem = netns.privilege_problem()
                if problem:
                    raise netns.ClusterError(problem)
                netns.cleanup_stale()
                self._build()
        except BaseException:
            self.down()
            raise
        return self

    @contextlib.contextmanager
    def _shield(self):
        """A signal that arrives inside takes effect at the end: the window between making a
        namespace (or starting a process) and recording it, or inside a teardown, is closed."""
        self._shielded += 1
        try:
            yield
        finally:
            self._shielded -= 1
            if not self._shielded and self._pending is not None:
                pending, self._pending = self._pending, None
                _raise_interrupt(pending, None)

    def _on_signal(self, signum, frame):
        if self._shielded and self._pending is None:
            self._pending = signum  # acted on when the step in progress is done
            return
        _raise_interrupt(signum, frame)  # not in a step, or a second signal: at once

    def _build(self):
        with netns.new_namespaces_use(self.congestion_control):
            for name in [self.switch] + self.netns:
                netns.sh("ip", "netns", "add", name)
                self._made.append(name)
        if self.congestion_control:
            for ns in self.netns:  # another run may have put the host's back in between
                got = netns.read_sysctl(netns.CC_SYSCTL, ns)
                if got != self.congestion_control:
                    raise netns.ClusterError(
                        f"node {self.netns.index(ns)}'s TCP congestion control is {got}, not "
                        f"{self.congestion_control}: was another cluster being built at the "
                        "same time? Run it again.")
        sw = self.switch
        netns.sh("ip", "-n", sw, "link", "add", "br0", "type", "bridge")
        netns.sh("ip", "-n", sw, "link", "set", "br0", "up")
        # IPv4 and its IPv6-mapped form (how a dual-stack listener sees its peers).
        hosts = "127.0.0.1 localhost\n" + "".join(
            f"{a} {h}\n::ffff:{a} {h}\n" for a, h in zip(self.addresses, self.hostnames))
        for i, ns in enumerate(self.netns):
            port = f"port{i}"
            # One veth pair, made directly inside the two namespaces: nothing in the host's.
            netns.sh("ip", "link", "add", netns.IFNAME, "netns", ns, "mtu", str(self.mtu),
                     "type", "veth", "peer", "name", port, "netns", sw, "mtu", str(self.mtu))
            netns.sh("ip", "-n", sw, "link", "set", port, "master", "br0", "up")
            netns.sh("ip", "-n", ns, "addr", "add", f"{self.addresses[i]}/24", "dev", netns.IFNAME)
            netns.sh("ip", "-n", ns, "link", "set", netns.IFNAME, "up")
            netns.sh("ip", "-n", ns, "link", "set", "lo", "up")
            if self.rate_bits:
                self._shape(ns, netns.IFNAME)  # the node's uplink
                self._shape(sw, port)  # the switch port towards it: the downlink
            etc = os.path.join(netns.NETNS_ETC, ns)
            os.makedirs(etc, exist_ok=True)
            with open(os.path.join(etc, "hosts"), "w") as f:
                f.write(hosts)

    def _shape(self, ns, dev):
        """tbf: tokens arrive at `rate`; a packet leaves only with tokens for its bytes."""
        byte_rate = self.rate_bits / 8
        # The bucket: 1 ms of tokens, at least 128 KiB. Smaller buckets cut the veth's 64 KiB
        # (GSO) packets and TCP loses rate (measured: 65 % of 1 Gbit/s at 64 KiB); a bigger
        # one lets longer bursts pass faster than the link. The queue holds 20 ms of data
        # before tbf drops (TCP then slows down).
        burst = self.burst or int(max(byte_rate * 0.001, 128 * 1024))
        netns.sh("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf",
                 "rate", f"{int(self.rate_bits)}bit", "burst", str(burst), "latency", "20ms")

    def down(self):
        """Stop every node's processes, remove every namespace (with its links and qdiscs)
        and file this cluster made."""
        try:
            with self._shield():
                self.stop()
                while self._made:
                    netns.remove_netns(self._made[-1])
                    self._made.pop()
        finally:
            self._restore_signals()

    def _catch_signals(self):
        # SIGTERM would end Python without running __exit__ (nothing removed): make it an
        # exception instead, so the `with` block unwinds; SIGINT too, through _on_signal, so
        # that neither cuts a step of building or removing in two. Main thread only.
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) in (signal.SIG_DFL, signal.default_int_handler, None):
                self._old_handlers[sig] = signal.signal(sig, self._on_signal)

    def _restore_signals(self):
        for sig, old in self._old_handlers.items():
            signal.signal(sig, old)
        self._old_handlers = {}


class _Interrupted(KeyboardInterrupt):
    pass


def _raise_interrupt(signum, _frame):
    raise _Interrupted(f"stopped by signal {signal.Signals(signum).name}")


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m dist_sgd.scale.cluster", description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example:\n  python -m dist_sgd.scale.cluster --nodes 2 --rate 1gbit -- "
               "'torchrun --nnodes $NNODES --node-rank $NODE_RANK --nproc-per-node 1 "
               "--master-addr $MASTER_ADDR --master-port $MASTER_PORT lessons/03_collectives.py'")
    parser.add_argument("--nodes", type=int, default=2, help="how many nodes (default 2)")
    parser.add_argument("--rate", default=None,
                        help="each link's speed, e.g. 1gbit, 100mbit (default: unshaped)")
    parser.add_argument("--burst", type=int, default=None,
                        help="tbf's token bucket in bytes (default: 1 ms of the rate, >= 128 KiB)")
    parser.add_argument("--congestion-control", default=netns.CONGESTION_CONTROL,
                        help="the nodes' TCP congestion control (default "
                             f"{netns.CONGESTION_CONTROL}; 'host': the host's)")
    parser.add_argument("--timeout", type=float, default=None, help="stop after this many seconds")
    parser.add_argument("--cleanup", action="store_true",
                        help="remove what killed (SIGKILL) runs left behind, then exit")
    parser.add_argument("cmd", nargs=argparse.REMAINDER,
                        help="after --: the command every node runs (one string: through sh -c)")
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if args.cleanup:
        problem = netns.privilege_problem()
        if problem:
            print(problem, file=sys.stderr)
            return 2
        removed = netns.cleanup_stale()
        print(f"removed {len(removed)} namespace(s) left behind"
              + (": " + ", ".join(removed) if removed else ""))
        return 0
    if not cmd:
        parser.error("give the command to run after --")
    if len(cmd) == 1 and " " in cmd[0]:
        cmd = cmd[0]  # one string: the shell splits it and expands $NODE_RANK per node
    try:
        rate = args.rate and f"{parse_rate(args.rate):.0f}"
        cc = None if args.congestion_control == "host" else args.congestion_control
        cluster = Cluster(args.nodes, args.rate, burst=args.burst, congestion_control=cc)
    except ValueError as e:
        parser.error(str(e))
    try:
        with cluster:
            shown = cmd if isinstance(cmd, str) else shlex.join(cmd)
            links = f"at {args.rate} ({int(rate) / 1e6:g} Mbit/s)" if rate else "unshaped"
            print(f"[cluster] {args.nodes} node(s) {', '.join(cluster.addresses)} on a bridge, "
                  f"links {links}; "
                  f"MASTER_ADDR={cluster.master_addr} MASTER_PORT={cluster.master_port}; "
                  f"running: {shown}", flush=True)
            codes = cluster.run(cmd, timeout=args.timeout, check=False)
    except netns.ClusterError as e:
        print(f"[cluster] {e}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt as e:
        print(f"[cluster] {str(e) or 'interrupted'}; every node stopped, namespaces removed",
              file=sys.stderr, flush=True)
        return 130
    order = cluster.order
    if any(c != 0 for c in codes):
        print(f"[cluster] {_failure_message(codes, order)}; namespaces removed", file=sys.stderr,
              flush=True)
        first = codes[next(r for r in order if codes[r] != 0)]
        return first if isinstance(first, int) and 0 < first < 256 else 1
    print("[cluster] every node finished; namespaces removed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
