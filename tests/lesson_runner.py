"""Runs lessons as `python lessons/NAME.py ARGS` does, without paying for torch's import in each.

A lesson started as a fresh interpreter imports torch twice before its first rank runs: once
itself, once more in the fork server that launch() starts (with torch._dynamo: ~7 s on 2
cores, most of a --quick lesson's time). This process imports the same modules once; for each
lesson it forks a child that runs the file as __main__ (sys.argv, sys.path[0], cwd and the
environment as the interpreter would set them), and that child forks its fork server from
itself, as multiprocessing would start one, but with the modules already imported. Nothing
here has run torch code before a fork, which is what makes forking safe (as in the fork server).

Starting the fork server this way sets three private attributes of CPython 3.11's
multiprocessing.forkserver (what ForkServer.ensure_running sets): pinned Python, but a newer
one may name them differently, and the lessons would then start fork servers of their own
(as slow as before, still correct).

Protocol, one JSON line each way: {"argv": [...], "env": {...}, "out": PATH} -> {"pid": N};
each lesson that ends -> {"ended": N, "code": exit code (negative: killed by that signal)}.

The tests' side is at the end (start_lesson, finish_lesson, run_lesson): one runner for the
whole session, so test_lessons and test_course share it, and a lesson that mostly waits can
start with the session (EARLY, from conftest.py). Importing this file imports no torch: the
runner process imports it in main().
"""
import importlib
import json
import os
import queue
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading

# Imported once in the runner, inherited by every lesson and fork server.
PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "dist_sgd.plumbing.launch"]


def _own_fork_server():
    """Start this process's fork server by forking it (it inherits the imports), and point
    multiprocessing's forkserver context at it, as ForkServer.ensure_running would."""
    from multiprocessing import connection, forkserver, util

    server = forkserver._forkserver
    listener = socket.socket(socket.AF_UNIX)
    address = connection.arbitrary_address("AF_UNIX")
    listener.bind(address)
    if not util.is_abstract_socket_namespace(address):
        os.chmod(address, 0o600)
    listener.listen()
    alive_r, alive_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(alive_w)
        try:
            forkserver.main(listener.fileno(), alive_r, PRELOAD, sys_path=list(sys.path))
        finally:
            os._exit(0)
    os.close(alive_r)
    listener.close()
    server._forkserver_address, server._forkserver_alive_fd = address, alive_w
    server._forkserver_pid = pid


def _run_lesson(argv, env, out):
    """In the forked child: the lesson file as __main__; never returns."""
    import atexit
    import runpy
    import traceback

    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))  # as `python FILE` sets it
    code = 0
    try:
        _own_fork_server()
        runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        if isinstance(e.code, int) or e.code is None:
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - printed as the interpreter would
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()  # multiprocessing's (stop the fork server), tempfile's, ...
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main():
    for name in PRELOAD:
        importlib.import_module(name)
    children = set()
    selector = selectors.DefaultSelector()
    selector.register(sys.stdin, selectors.EVENT_READ)
    reply = sys.stdout
    while True:
        for _key, _ in selector.select(timeout=0.05):
            line = sys.stdin.readline()
            if not line:  # the suite is done: the lessons still running are its to stop
                return
            request = json.loads(line)
            reply.flush()
            pid = os.fork()
            if pid == 0:
                selector.close()
                _run_lesson(request["argv"], request["env"], request["out"])
            children.add(pid)
            reply.write(json.dumps({"pid": pid}) + "\n")
            reply.flush()
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                children.discard(pid)
                reply.write(json.dumps({"ended": pid, "code": os.waitstatus_to_exitcode(status)})
                            + "\n")
                reply.flush()


# ---- the tests' side: one runner for the session -------------------------------------------

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Lessons that mostly wait (paced steps, a 10 s timeout, nodes rejoining: lesson 17 is ~60%
# idle alone, ~60 s): conftest.py starts them with the session, so they wait beside the other
# files' tests, not at the end of test_lessons; their test there collects them.
EARLY = ("17",)


class _Runner:
    """This file as a process: it imports torch once and forks each lesson from itself (a
    fresh interpreter per lesson would import torch twice, ~7 s each)."""

    def __init__(self, env):
        # The SIGINT that ends a lesson on a timeout must reach it however the suite was
        # started (`cmd &` in a script starts it with SIGINT ignored, and the runner would keep
        # that): a Python handler here is reset to the default by exec, so the runner gets it.
        old = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__)], cwd=ROOT,
                                         env=env, text=True, stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE)
        finally:
            signal.signal(signal.SIGINT, old)
        self.pids, self.ended, self.changed = queue.Queue(), {}, threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            message = json.loads(line)
            if "pid" in message:
                self.pids.put(message["pid"])
            else:
                with self.changed:
                    self.ended[message["ended"]] = message["code"]
                    self.changed.notify_all()
        with self.changed:
            self.gone = True
            self.changed.notify_all()

    def start(self, argv, env, out):
        self.proc.stdin.write(json.dumps({"argv": argv, "env": env, "out": out}) + "\n")
        self.proc.stdin.flush()
        return _Forked(self, self.pids.get(timeout=60), argv)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


class _Forked:
    """A lesson the runner forked, with the part of Popen's interface the tests use."""

    def __init__(self, runner, pid, argv):
        self.runner, self.pid, self.args = runner, pid, argv

    @property
    def returncode(self):
        return self.runner.ended.get(self.pid)

    def poll(self):
        return self.returncode

    def wait(self, timeout):
        with self.runner.changed:
            if not self.runner.changed.wait_for(
                    lambda: self.pid in self.runner.ended or getattr(self.runner, "gone", 0),
                    timeout):
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig):
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self):
        self.send_signal(signal.SIGKILL)


_runner = []
background = {}  # lesson name -> started, for its test to collect (finish_lesson)


def start_lesson(name, *args, env=None):
    """The lesson at --quick, started as `python lessons/NAME --quick ARGS` would run it (see
    above); its output goes to a file (a pipe nobody reads fills). env: added variables."""
    argv = [os.path.join("lessons", name), "--quick", *args]
    base = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    if not _runner:
        _runner.append(_Runner(base))
    out = tempfile.NamedTemporaryFile("w+", suffix=".out")
    return [sys.executable, *argv], out, _runner[0].start(argv, dict(base, **(env or {})),
                                                           out.name)


def stop(proc):
    """A lesson still running: SIGINT first (the cluster command removes what it made)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def finish_lesson(started, timeout=240):
    cmd, out, proc = started
    try:
        proc.wait(timeout=timeout)
    finally:
        stop(proc)
    out.seek(0)
    output = out.read()
    assert proc.returncode == 0, f"{' '.join(cmd)} failed ({proc.returncode}):\n{output[-4000:]}"
    assert "Traceback" not in output, output[-4000:]
    return output


def run_lesson(name, *args, timeout=240, env=None):
    return finish_lesson(start_lesson(name, *args, env=env), timeout)


def close():
    """The session is over: stop what was never collected, then the runner."""
    while background:
        stop(background.popitem()[1][2])
    if _runner:
        _runner.pop().close()


if __name__ == "__main__":
    main()
