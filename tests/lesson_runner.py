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
"""
import json
import os
import selectors
import socket
import sys

import torch  # noqa: F401 - imported once here, inherited by every lesson and fork server
import torch._dynamo  # noqa: F401
import torch.distributed  # noqa: F401

import dist_sgd.plumbing.launch  # noqa: F401

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


if __name__ == "__main__":
    main()
