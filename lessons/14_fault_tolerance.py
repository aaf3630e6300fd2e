"""Lesson 14: when a rank dies - checkpoint and restart bit for bit, or recover from a live peer.

Real jobs lose machines: Li et al. (OSDI 2014) saw 7.8%, 13.7% and 24.7% of jobs of about 100,
1,000 and 10,000 machine-hours fail. A master-worker framework re-assigns a dead worker's tasks;
synchronous SGD cannot, because every step needs every rank. Two ways to go on:

1. Checkpoint and restart. Every K steps the ranks save everything the run needs to continue
   *exactly* (dist_sgd/checkpoint.py: model, optimizer with its momentum, the step, the
   sampler's epoch and position, every random generator; written atomically, so a crash while
   writing never leaves a torn "latest"). torchrun --max-restarts restarts the whole group when
   a worker dies; the new workers find the checkpoint and resume. The cost of a failure: the
   restart, the reload, and the steps since the last checkpoint, computed again. Checkpoint
   often and each checkpoint costs time; rarely and each failure costs more. Young's
   approximation of the best interval: sqrt(2 x checkpoint cost x mean time between failures).
2. Recovery from a live peer (dist_sgd/peer_recovery.py, torchft's idea by hand): the survivors
   keep their state, a replacement joins a re-formed group and receives the weights and
   optimizer state from a survivor. No restart, no checkpoint read, at most one step redone.

Every random draw here is a function of (step, rank): the batch through ShardSampler's
(seed, epoch) and the dropout masks through torch.manual_seed(step, rank). So a resumed or
replacement rank draws exactly what the lost one would have, and all three runs below (never
interrupted; killed and restarted by torchrun; killed and recovered from a peer) must end with
the same weights, bit for bit: the lesson compares their sha256.

Run:
    python lessons/14_fault_tolerance.py                  # the whole story (3 runs, 2 ranks)
    python lessons/14_fault_tolerance.py --quick
    # one training run, resumable; kill a worker and torchrun restarts the group from the
    # latest checkpoint in DIR (run it twice: the second run says "resumed from step ..."):
    torchrun --standalone --nproc-per-node 2 --max-restarts 3 lessons/14_fault_tolerance.py \\
        --steps 200 --checkpoint-every 25 --checkpoint-dir /tmp/ckpt

Exercises:
  1. Kill a worker by hand (kill -9 <pid> from another terminal) during the torchrun command
     above: where does it resume, and how many steps are done twice?
  2. Set --checkpoint-every to 1 and to 100: how do the checkpoint cost and the recomputed steps
     change? Where is Young's interval for a mean time between failures of one hour?
  3. Drop the torch.manual_seed line in one_step: which of the three hashes still agree, and why?
"""
import os
import random
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

from dist_sgd.faults.chaos import run_and_kill, write_step
from dist_sgd.plumbing.check import check, max_diff
from dist_sgd.faults.checkpoint import load_checkpoint, save_checkpoint, weights_sha256
from dist_sgd.sgd.data import get_dataset
from dist_sgd.ddp.ddp import DistributedDataParallel
from dist_sgd.plumbing.launch import launch, lesson_parser
from dist_sgd.plumbing.rank import log, under_torchrun
from dist_sgd.sgd.models import Net
from dist_sgd.sgd.optim import SGD
from dist_sgd.sgd.partition import ShardSampler
from dist_sgd.faults.peer_recovery import run_with_peer_recovery
from dist_sgd.sgd.train import per_rank_batch

GLOBAL_BATCH, SEED = 64, 14


def build(state=None):
    """Net in our DDP, SGD with momentum; loaded from `state` when a peer sent one."""
    torch.manual_seed(SEED)
    ddp = DistributedDataParallel(Net())
    opt = SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    if state is not None:  # in place: DDP holds no copy of the weights
        ddp.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
    return ddp, opt


def one_step(model, opt, data, sampler, step, rank, world_size):
    """Step `step`: this rank's slice of the global batch, forward, backward (DDP averages the
    gradients), update. Batch and dropout depend on (step, rank) alone."""
    per_rank = per_rank_batch(GLOBAL_BATCH, world_size)
    epoch, position = divmod(step, len(sampler) // per_rank)
    sampler.set_epoch(epoch)
    idx = list(sampler)[position * per_rank:(position + 1) * per_rank]
    torch.manual_seed(SEED + step * world_size + rank)  # this step's dropout masks
    opt.zero_grad()
    F.nll_loss(model(data[0][idx]), data[1][idx]).backward()
    opt.step()
    return {"epoch": epoch, "position": position + 1}


def train(rank, world_size, steps, every, ckpt_dir, data_name):
    """One resumable training run (under torchrun, or spawned by launch)."""
    data = get_dataset(data_name, quiet=True).tensors
    sampler = ShardSampler(data[0], world_size, rank, seed=SEED)
    model, opt = build()
    start, saves = time.perf_counter(), []
    state = load_checkpoint(ckpt_dir, model, opt)
    first = step = state["step"] if state else 0
    if state:
        log(f"resumed from step {step} (loaded in {time.perf_counter() - start:.3f} s)")
    while step < steps:
        sampler_state = one_step(model, opt, data, sampler, step, rank, world_size)
        step += 1
        if rank == 0:  # how far we got: the lesson counts the steps done twice
            write_step(os.path.join(ckpt_dir, "progress"), step)
        if step % every == 0 or step == steps:
            t = time.perf_counter()
            save_checkpoint(ckpt_dir, step, model, opt, sampler_state=sampler_state)
            saves.append(time.perf_counter() - t)
    log(f"final weights sha256: {weights_sha256(model)}")
    return {"digest": weights_sha256(model), "weights": list(model.parameters()),
            "step_s": (time.perf_counter() - start - sum(saves)) / max(steps - first, 1),
            "checkpoint_s": sum(saves) / max(len(saves), 1)}


def peer_train(group, steps, data_name):
    """The same training, surviving a dead peer: on a failed collective, re-form and sync."""
    data = get_dataset(data_name, quiet=True).tensors
    sampler = ShardSampler(data[0], group.world_size, group.rank, seed=SEED)
    # The first ranks start fresh (building DDP is a collective: all of them at once); a
    # replacement builds nothing before it has a peer's state, or it would meet them out of step.
    state = group.sync(snapshot(*build(), 0) if group.generation == 0 else None)
    model, opt, step = *build(state), state["step"]
    while step < steps:
        try:
            one_step(model, opt, data, sampler, step, group.rank, group.world_size)
            step += 1
            group.progress(step)
        except group.FAILURES as error:
            # Our weights are those before this step (the update follows the last all-reduce):
            # offer them, take the newest any peer has, rebuild DDP on the re-formed group.
            state = group.recover(snapshot(model, opt, step), error)
            model, opt, step = *build(state), state["step"]
    return list(model.parameters())


def snapshot(model, opt, step):
    return {"step": step, "model": model.module.state_dict(), "optimizer": opt.state_dict()}


def killed_torchrun_run(world_size, steps, every, ckpt_dir, data_name):
    """Start torchrun, kill one worker at a random moment, let torchrun restart the group."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           str(world_size), "--max-restarts", "3", __file__, "--steps", str(steps),
           "--checkpoint-every", str(every), "--checkpoint-dir", ckpt_dir]
    done, killed_at, lines = run_and_kill(  # after the first checkpoint, before the end
        cmd, os.path.join(ckpt_dir, "progress"), random.randint(every + 1, steps - 2),
        env=dict(os.environ, DIST_SGD_DATASET=data_name))  # workers need not look for data again
    back_at, line = next((t, line) for t, line in lines if "resumed from step" in line)
    return {"done": done, "resumed": int(line.split("resumed from step")[1].split()[0]),
            "recovery_s": back_at - killed_at,
            "digest": [line for _, line in lines if "sha256" in line][-1].split()[-1]}


def main():
    parser = lesson_parser(__doc__)
    parser.add_argument("--steps", type=int, help="steps to train (default 200; --quick: 24)")
    parser.add_argument("--checkpoint-every", type=int, help="steps between checkpoints")
    parser.add_argument("--checkpoint-dir", help="train once, resuming from DIR's latest checkpoint")
    args = parser.parse_args()
    steps, every = args.steps or (24 if args.quick else 200), args.checkpoint_every or (8 if args.quick else 25)
    data_name = get_dataset("auto", quiet=bool(args.checkpoint_dir)).name
    if args.checkpoint_dir:  # the training run itself: what torchrun starts and restarts
        return launch(train, args.world_size, steps, every, args.checkpoint_dir, data_name)
    if under_torchrun():  # the story starts torchrun itself: run it as plain python
        parser.error("under torchrun, pass --checkpoint-dir DIR (one resumable training run)")
    with tempfile.TemporaryDirectory() as tmp:
        log(f"1. {steps} steps on {args.world_size} ranks, never interrupted, a checkpoint every {every} steps")
        ref = launch(train, args.world_size, steps, every, os.path.join(tmp, "a"), data_name)[0]
        log("2. the same under torchrun --max-restarts 3, one worker killed at a random moment")
        run = killed_torchrun_run(args.world_size, steps, every, os.path.join(tmp, "b"), data_name)
    log(f"   killed after step {run['done']}, resumed from step {run['resumed']}; final sha256 "
        f"{run['digest'][:16]}... equal to the uninterrupted run's: {run['digest'] == ref['digest']}")
    assert run["digest"] == ref["digest"], "the restarted run ended with other weights"
    victim, at = random.randrange(args.world_size), random.randint(2, steps - 2)
    log(f"3. peer recovery: rank {victim} killed after step {at}, a replacement joins")
    weights, events = run_with_peer_recovery(peer_train, args.world_size, args=(steps, data_name), kill=(victim, at))
    log(check("   every rank's weights after recovery vs the uninterrupted run's",
              max(max_diff(w, ref["weights"]) for w in weights), 0.0))
    peer_s = max(t for what, _, t in events if what == "resumed") - events[0][2]  # kill -> resumed
    step_s, ckpt_s, redo = ref["step_s"], ref["checkpoint_s"], run["done"] - run["resumed"]
    log(f"\nwhat a failure cost (one step {1e3 * step_s:.1f} ms, one checkpoint {1e3 * ckpt_s:.1f} ms):")
    log(f"   checkpoint-restart: {run['recovery_s']:.2f} s to restart and reload, then {redo} steps "
        f"done again ({redo * step_s:.2f} s)")
    log(f"   peer recovery:      {peer_s:.2f} s to re-form the group and copy the state from a "
        f"peer, at most 1 step done again")
    for hours in (1, 24):  # Young (1974): the interval that minimizes checkpoint + lost work
        best = (2 * ckpt_s * hours * 3600) ** 0.5
        log(f"   mean time between failures {hours:2d} h: Young's interval sqrt(2 x {ckpt_s:.3f} s "
            f"x {hours * 3600} s) = {best:.0f} s = {best / step_s:,.0f} steps")


if __name__ == "__main__":
    main()
