"""The Linux plumbing under dist_sgd.scale.cluster: network namespaces made, inspected and
removed, their TCP's congestion control, the processes inside them. Nothing here knows about
nodes, links or ranks (cluster.py does); everything needs root and iproute2's `ip`.
"""
import contextlib
import fcntl
import os
import re
import shutil
import signal
import subprocess
import tempfile

PREFIX = "dsgd"  # every namespace this module makes is named dsgd<pid>n<i> or dsgd<pid>sw
IFNAME = "eth0"  # each node's interface (names are per namespace: no clash with the host's)
NETNS_ETC = "/etc/netns"  # `ip netns exec NAME` bind-mounts /etc/netns/NAME/* over /etc/*

# Every node's TCP runs cubic, Linux's default, whatever the host's is. Some hosts run BBR,
# which paces each connection at its own estimate of its share: when a rank sends to several
# peers at once, or to a new partner each round, the link sat idle for 50-150 ms at a time
# (measured, 8 nodes at 100 Mbit/s: naive's all-reduce of 1 MiB 1218-2238 ms with BBR,
# 1217-1222 with cubic; halving-doubling's of 4 MiB at 4 nodes 631 ms median, 535 with cubic,
# the link's 534). Cubic keeps the shaper's queue full: the link, not TCP, sets the pace.
CONGESTION_CONTROL = "cubic"
CC_SYSCTL = "net/ipv4/tcp_congestion_control"


class ClusterError(RuntimeError):
    """The cluster could not be built, or a node failed (`.nodes` lists which)."""

    def __init__(self, message, nodes=()):
        super().__init__(message)
        self.nodes = list(nodes)


def sh(*argv, check=True):
    """Run one ip/tc command; raise ClusterError with its own error message when it fails."""
    proc = subprocess.run(argv, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise ClusterError(f"`{' '.join(argv)}` failed: {proc.stderr.strip() or proc.returncode}")
    return proc


def privilege_problem():
    """None when namespaces can be made here, else one sentence saying what is missing."""
    missing = [tool for tool in ("ip", "tc", "unshare") if shutil.which(tool) is None]
    if missing:
        return ("dist_sgd.scale.cluster needs iproute2's `ip` and `tc` and util-linux's "
                f"`unshare`; missing: {', '.join(missing)}.")
    probe = f"{PREFIX}{os.getpid()}probe"
    try:
        made = sh("ip", "netns", "add", probe, check=False)
    finally:
        sh("ip", "netns", "del", probe, check=False)  # also when a Ctrl-C lands in between
    if made.returncode != 0:
        return ("dist_sgd.scale.cluster needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) to create "
                "network namespaces: run it with sudo, or in a container started with --privileged "
                f"(ip netns add said: {made.stderr.strip()}).")
    return None


def ours():
    """Names of the namespaces any run of this module made that still exist."""
    out = sh("ip", "netns", "list", check=False).stdout
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return [n for n in names if re.fullmatch(PREFIX + r"\d+(n\d+|sw|probe)", n)]


def cleanup_stale():
    """Remove what runs killed with SIGKILL left behind (their pid is gone). Returns the names."""
    removed = []
    for name in ours():
        pid = int(re.match(PREFIX + r"(\d+)", name).group(1))
        if pid != os.getpid() and not os.path.exists(f"/proc/{pid}"):
            remove_netns(name)
            removed.append(name)
    return removed


def read_sysctl(key, netns=None):
    """A sysctl's value, in the host's namespace or in netns."""
    if netns is None:
        with open(f"/proc/sys/{key}") as f:
            return f.read().strip()
    return sh("ip", "netns", "exec", netns, "cat", f"/proc/sys/{key}").stdout.strip()


@contextlib.contextmanager
def new_namespaces_use(congestion):
    """Namespaces made inside copy `congestion` as their TCP congestion control.

    A new namespace starts with the host's default, and inside one only the host's "allowed"
    algorithms can be set (cubic is not on every host): so the host's default is `congestion`
    while they are made, and is put back at once (also on an error). None: the host's. A lock
    file keeps two runs building at once from putting back each other's."""
    if not congestion:
        yield
        return
    with open(os.path.join(tempfile.gettempdir(), f"{PREFIX}-netns.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        old = read_sysctl(CC_SYSCTL)
        if old == congestion:
            yield
            return
        available = read_sysctl("net/ipv4/tcp_available_congestion_control").split()
        if congestion not in available:
            raise ClusterError(f"TCP congestion control {congestion!r} is not available on "
                               f"this host (it has {', '.join(available)}); pass "
                               "congestion_control=None to keep the host's")
        with open(f"/proc/sys/{CC_SYSCTL}", "w") as f:
            f.write(congestion)
        try:
            yield
        finally:
            with open(f"/proc/sys/{CC_SYSCTL}", "w") as f:
                f.write(old)


def remove_netns(name):
    # Processes still inside keep a namespace (and its links) alive after its name is gone.
    pids = sh("ip", "netns", "pids", name, check=False).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    sh("ip", "netns", "del", name, check=False)  # veth ends go with it; the peer end too
    shutil.rmtree(os.path.join(NETNS_ETC, name), ignore_errors=True)


def kill_inside(ns):
    for pid in sh("ip", "netns", "pids", ns, check=False).stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def signal_group(proc, sig):
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
