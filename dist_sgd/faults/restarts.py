"""torchrun's restart hang (torch 2.14.1), reproduced; and runs killed and restarted, counted.

    python -m dist_sgd.faults.restarts --runs 10 --share-store   # torch's default: runs fail/hang
    python -m dist_sgd.faults.restarts --runs 50                 # with the work-around: 50 of 50
    python -m dist_sgd.faults.restarts --runs 50 --script lessons/14_fault_tolerance.py

Each run starts `torchrun --standalone --nproc-per-node 2 --max-restarts 1`, SIGKILLs one
worker once training has passed its first checkpoint, lets torchrun restart the group, and
compares the final sha256 with an uninterrupted run's; a run longer than --limit seconds is
stopped and counted as hung. The trigger: in every restarted attempt, the last rank starts
--late seconds after the others (a slow machine, a long import), through a shell wrapper, so
the training script itself is the plain one. Without --script the script is this file: a
resumable sum over steps that uses torch.distributed alone (init_process_group with env://).

Why the restarted attempt hangs (gloo's keys of a dead attempt in torchrun's shared store) and
the work-around, TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: torchrun()'s docstring.
"""
import argparse
import datetime
import hashlib
import os
import signal
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist

from dist_sgd.faults.chaos import kill_a_worker, torchrun_workers, write_step

WORKAROUND = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
STEPS, EVERY, STEP_S = 60, 5, 0.02  # STEP_S: a sleep standing for a step's compute
# The last local rank of a restarted attempt starts `late` seconds after the others.
LATE_START = ('if [ "$TORCHELASTIC_RESTART_COUNT" != 0 ] && '
              '[ "$LOCAL_RANK" = $(( LOCAL_WORLD_SIZE - 1 )) ]; then sleep "$LATE"; fi; '
              'exec "$0" "$@"')


def plain_worker(ckpt_dir, steps=STEPS, every=EVERY):
    """A resumable run that uses torch.distributed alone: the state after step s is the sum of
    1..s all-reduced over the ranks and averaged (exact in float64), saved every `every` steps."""
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    path = os.path.join(ckpt_dir, "state.pt")
    step, total = torch.load(path) if os.path.exists(path) else \
        (0, torch.zeros(1000, dtype=torch.float64))  # on the CPU: a gloo job by design
    while step < steps:
        t = torch.full((1000,), float(step + 1), dtype=torch.float64)  # on the CPU: gloo's
        time.sleep(STEP_S)  # the step's compute: a killer watching the progress gets its chance
        dist.all_reduce(t)
        total, step = total + t / size, step + 1
        if rank == 0:
            if step % every == 0:
                torch.save((step, total), path + ".tmp")
                os.replace(path + ".tmp", path)
            write_step(os.path.join(ckpt_dir, "progress"), step)
    dist.barrier()
    if rank == 0:
        print(f"final sha256: {hashlib.sha256(total.numpy().tobytes()).hexdigest()}", flush=True)
    dist.destroy_process_group()


def torchrun(script_args, ckpt_dir, restarts=1, late=0.0, share_store=False, env=None):
    """The command line and environment of one run (the late start wrapped around the script).

    The cause. torchrun's agent hosts the store its workers meet in (MASTER_ADDR:MASTER_PORT,
    TORCHELASTIC_USE_AGENT_STORE=True) and, since torch 2.4 shares one store across the whole job,
    keeps it when it restarts the workers. init_process_group(env://) uses that store without a
    per-attempt prefix, and gloo's rendezvous writes each rank's listening address under a fixed
    key ("0//cpu//0/<rank>") and reads its peers'. After a restart those keys still hold the dead
    attempt's addresses until each new rank overwrites its own. Of two ranks, one connects and the
    other listens (decided by address order); when the connecting rank reads the other's key
    before that rank, started late, has rewritten it, it connects to a dead address: nothing
    listens there (refused; gloo retries and fails after seconds, using up a restart) or another
    socket reuses the port (the handshake never completes: the hang). 2.14.1's rendezvous reuses
    its store server while it lives (how torch came to this: lesson 14's docstring).

    The work-around, applied on every torchrun path the lessons use:
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in torchrun's environment (torch's own switch). Every
    rendezvous round then gets a fresh store (rank 0's worker hosts it on a new port), so no key of
    a dead attempt exists; it works for a plain script and across nodes, where restart counts differ
    between nodes (a node that joins late starts at 0) and a per-attempt key prefix would not agree.
    dist_sgd's launch() is immune without it too (its keys carry the attempt under the shared
    store), on one node.
    """
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "--max-restarts", str(restarts), "--no-python", "sh", "-c", LATE_START, sys.executable,
           *script_args, "--checkpoint-dir", ckpt_dir]
    env = dict(env or os.environ, LATE=str(late), OMP_NUM_THREADS="1")
    if not share_store:
        env.update(WORKAROUND)
    return cmd, env


def digest_of(output):
    lines = [line for line in output.splitlines() if "sha256:" in line]
    return lines[-1].split()[-1] if lines else None


def killed_run(script_args, kill_after, late=2.0, share_store=False, limit=60.0, env=None):
    """One run: kill a worker after each step in kill_after (one restart each). Returns
    (final sha256, or None when it failed or ran over `limit` seconds; seconds; its output)."""
    with tempfile.TemporaryDirectory() as ckpt, open(os.path.join(ckpt, "out"), "w+") as log:
        cmd, env = torchrun(script_args, ckpt, len(kill_after), late, share_store, env)
        start = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            for step in kill_after:
                kill_a_worker(proc, os.path.join(ckpt, "progress"), step, timeout=limit)
            proc.wait(timeout=max(1.0, limit - (time.monotonic() - start)))
        except (subprocess.TimeoutExpired, RuntimeError):
            pass
        finally:
            if proc.poll() is None:  # over the limit: the workers first (torchrun's children)
                for pid in torchrun_workers(proc):
                    os.kill(pid, signal.SIGKILL)
                proc.kill()
                proc.wait()
        seconds = time.monotonic() - start
        log.seek(0)
        out = log.read()
    return digest_of(out) if proc.returncode == 0 else None, seconds, out


def uninterrupted(script_args, env=None):
    with tempfile.TemporaryDirectory() as ckpt:
        cmd, env = torchrun(script_args, ckpt, 0, env=env)
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300).stdout
    return digest_of(out)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m dist_sgd.faults.restarts",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10,
                        help="killed-and-restarted runs (default 10)")
    parser.add_argument("--script", help="a training script (default: the plain one in this file)")
    parser.add_argument("--late", type=float, default=2.0,
                        help="seconds the last rank restarts late")
    parser.add_argument("--share-store", action="store_true",
                        help="without the work-around (torch's default): reproduce the hang")
    parser.add_argument("--limit", type=float, default=60.0,
                        help="seconds before a run counts as hung")
    parser.add_argument("--checkpoint-dir", help="(what torchrun's workers get: run one training)")
    args = parser.parse_args(argv)
    if args.checkpoint_dir:  # inside torchrun: this process is one worker of the plain script
        return plain_worker(args.checkpoint_dir)
    script = [args.script, "--steps", "16", "--checkpoint-every", "4", "--quick"] if args.script \
        else [os.path.abspath(__file__)]
    steps = 16 if args.script else STEPS
    want = uninterrupted(script)
    print(f"uninterrupted: sha256 {want}; now {args.runs} runs, one worker killed in each, the "
          f"last rank restarting {args.late:g} s late, "
          + ("the shared store (torch default)" if args.share_store else
             "with " + str(WORKAROUND)),
          flush=True)
    good, times = 0, []
    for i in range(args.runs):
        digest, seconds, out = killed_run(script, [steps // 2 + 1], args.late, args.share_store,
                                          args.limit)
        good, times = good + (digest == want), times + [seconds]
        verdict = "same hash" if digest == want else ("HUNG" if seconds >= args.limit else "FAILED")
        print(f"run {i + 1:2d}: {seconds:5.1f} s, {verdict}", flush=True)
        if digest != want:
            print("   " + "\n   ".join(line[:160] for line in out.splitlines()
                                     if "rror" in line or "connect" in line)[-1500:], flush=True)
    print(f"{good} of {args.runs} ended with the uninterrupted hash; slowest {max(times):.1f} s",
          flush=True)
    return 0 if good == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
