"""Failure injection for lesson 14 and its tests: kill one worker of a running torchrun.

torchrun (its elastic agent) starts the workers as its own child processes; killing one
with SIGKILL is what a crashed machine or an out-of-memory kill looks like to the others.
"""
import os
import random
import signal
import subprocess
import time

from dist_sgd.plumbing.rank import rank


def torchrun_workers(proc):
    """The pids of the workers the torchrun process `proc` started (its children)."""
    out = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout
    return [int(pid) for pid in out.split()]


def read_step(path):
    """The step number a run writes to `path` as it goes (0 before the file exists)."""
    try:
        with open(path) as f:
            return int(f.read() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def kill_a_worker(proc, progress_path, after_step, timeout=300):
    """Once the run's progress file says `after_step`, SIGKILL one of its workers, chosen at
    random. Returns (the step it had reached, time.perf_counter() of the kill)."""
    deadline = time.monotonic() + timeout
    while read_step(progress_path) < after_step:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the run ended (or stalled) before step {after_step}")
        time.sleep(0.002)
    done = read_step(progress_path)
    os.kill(random.choice(torchrun_workers(proc)), signal.SIGKILL)
    return done, time.perf_counter()


def run_and_kill(cmd, progress_path, after_step, env=None, timeout=300):
    """Run `cmd` (a torchrun command line), kill one of its workers once its progress file says
    `after_step`, and let it finish. Returns the step reached at the kill, the time of the
    kill, and every output line with the time it arrived (time.perf_counter())."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)
    try:
        done, killed_at = kill_a_worker(proc, progress_path, after_step, timeout)
        lines = [(time.perf_counter(), line.rstrip("\n")) for line in proc.stdout]
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} ended with exit code {proc.returncode}:\n"
                           + "\n".join(line for _, line in lines[-30:]))
    return done, killed_at, lines


def write_step(path, step):
    """Record how far a run got (after every step; only rank 0 writes): kill_a_worker reads it.
    Written beside the file and renamed over it: a reader never meets it emptied (truncated
    in place, it read as step 0 while being rewritten, and lesson 17 once counted -30 steps
    repeated)."""
    if rank() != 0:
        return
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(str(step))
    os.replace(tmp, path)
