"""Lesson 14: when a rank dies - checkpoint and restart bit for bit, or recover from a live peer.

Real jobs lose machines: Li et al. (OSDI 2014) saw 7.8%, 13.7% and 24.7% of jobs of about 100,
1,000 and 10,000 machine-hours fail. A master-worker framework re-assigns a dead worker's tasks;
synchronous SGD cannot, because every step needs every rank. Two ways to go on:

1. Checkpoint and restart. Every K steps the ranks save everything the run needs to continue
   *exactly* (dist_sgd/faults/checkpoint.py: model, optimizer with its momentum, the step, the
   data position, every random generator; written atomically, so a crash while
   writing never leaves a torn "latest"). torchrun --max-restarts restarts the whole group when
   a worker dies; the new workers find the checkpoint and resume. The cost of a failure: the
   restart, the reload, and the steps since the last checkpoint, computed again. Checkpoint
   often and each checkpoint costs time; rarely and each failure costs more. Young's
   approximation of the best interval: sqrt(2 x checkpoint cost x mean time between failures).
2. Recovery from a live peer (dist_sgd/faults/peer_recovery.py, torchft's idea by hand): the
   survivors keep their state, a replacement joins a re-formed group and receives the weights
   and optimizer state from a survivor. No restart, no checkpoint read, at most one step redone.

Every random draw here is a function of (step, rank): the batch through ShardSampler's
(seed, epoch) and the dropout masks through torch.manual_seed(step, rank). So a resumed or
replacement rank draws exactly what the lost one would have, and all three runs below (never
interrupted; killed and restarted by torchrun; killed and recovered from a peer) must end with
the same weights, bit for bit: the lesson compares them (tolerance 0).

One setting on every torchrun command here: TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1. torch 2.14.1's
torchrun keeps one store across restarts, and a restarted rank can read the dead attempt's
addresses from it and hang in init_process_group (`python -m dist_sgd.faults.restarts`
reproduces it and explains why); with the setting every restart meets in a fresh store. How
torch came to this: the store shared across restarts arrived with torch 2.4 (pytorch#128096);
pytorch#135712 reported the stale keys; the fix proposed (a fresh store per restart,
pytorch#135957) is not what 2.14.1's rendezvous does.

Run:
    python lessons/14_fault_tolerance.py                  # the whole story (3 runs, 2 ranks)
    python lessons/14_fault_tolerance.py --quick
    # one training run, resumable; kill a worker and torchrun restarts the group from the
    # latest checkpoint in DIR (run it twice: the second run says "resumed from step ..."):
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --standalone --nproc-per-node 2 \\
        --max-restarts 3 lessons/14_fault_tolerance.py --steps 200 --checkpoint-every 25 \\
        --checkpoint-dir /tmp/ckpt

Exercises:
  0. Write the checkpoint yourself: `python3 -m dist_sgd.course start save_checkpoint`, then
     `python3 -m dist_sgd.course check save_checkpoint` kills a run after step 3 of 6, resumes
     it from your checkpoint and compares it with the uninterrupted run, bit for bit.
  1. Kill a worker by hand (kill -9 <pid> from another terminal) during the torchrun command
     above: where does it resume, and how many steps are done twice?
  2. Set --checkpoint-every to 1 and to 100: how do the checkpoint cost and the recomputed steps
     change? Where is Young's interval for a mean time between failures of one hour?
  3. Drop the torch.manual_seed line in one_step: which of the three runs still agree, and why?
"""
import os
import random
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

from dist_sgd.ddp.ddp import DistributedDataParallel
from dist_sgd.faults.chaos import run_and_kill, write_step
from dist_sgd.faults.checkpoint import load_checkpoint, save_checkpoint, weights_sha256
from dist_sgd.faults.peer_recovery import current_group, run_with_peer_recovery, state_of
from dist_sgd.plumbing.check import check, exact_float32, max_diff
from dist_sgd.plumbing.launch import launch, lesson_parser
from dist_sgd.plumbing.rank import device, log, under_torchrun
from dist_sgd.sgd.data import get_dataset
from dist_sgd.sgd.models import Net
from dist_sgd.sgd.optim import SGD
from dist_sgd.sgd.partition import ShardSampler
from dist_sgd.sgd.train import per_rank_batch

GLOBAL_BATCH, SEED = 64, 14


def build(state=None):
    """Net in our DDP, SGD with momentum; loaded from `state` when a peer sent one."""
    torch.manual_seed(SEED)
    ddp = DistributedDataParallel(Net().to(device()))  # NCCL: this rank's GPU
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


def run(rank, world_size, args, part="restart"):
    """One rank's training: resumable from checkpoints (part "restart": under torchrun or
    launch), or surviving a dead peer (part "peer": under run_with_peer_recovery)."""
    exact_float32(deterministic=True)  # a GPU: "bit for bit" needs deterministic kernels
    data = [t.to(device()) for t in get_dataset(args.data, quiet=True).tensors]
    sampler = ShardSampler(data[0], world_size, rank, seed=SEED)
    if part == "peer":
        return with_a_peer(current_group(), data, sampler, args.steps)
    (model, opt), start, saves = build(), time.perf_counter(), []
    state = load_checkpoint(args.checkpoint_dir, model, opt)
    first = step = state["step"] if state else 0
    if state:
        log(f"{state['resumed']} (loaded in {time.perf_counter() - start:.3f} s)")
    while step < args.steps:
        one_step(model, opt, data, sampler, step, rank, world_size)
        step += 1
        write_step(os.path.join(args.checkpoint_dir, "progress"), step)  # to count steps redone
        if step % args.checkpoint_every == 0 or step == args.steps:
            t = time.perf_counter()
            save_checkpoint(args.checkpoint_dir, step, model, opt, items=step * GLOBAL_BATCH)
            saves.append(time.perf_counter() - t)
    log(f"final weights sha256: {weights_sha256(model)}")
    return {"weights": list(model.parameters()), "checkpoint_s": sum(saves) / max(len(saves), 1),
            "step_s": (time.perf_counter() - start - sum(saves)) / max(args.steps - first, 1)}


def with_a_peer(group, data, sampler, steps):
    """The same training, surviving a dead peer: on a failed collective, re-form and sync."""
    # The first ranks start fresh (building DDP is a collective: all of them at once); a
    # replacement builds nothing before it has a peer's state, or it would meet them out of step.
    state = group.sync(state_of(*build(), 0) if group.generation == 0 else None)
    model, opt, step = *build(state), state["step"]
    while step < steps:
        try:
            one_step(model, opt, data, sampler, step, group.rank, group.world_size)
            step += 1
            group.progress(step)
        except group.FAILURES as error:
            # Our weights are those before this step (the update follows the last all-reduce):
            # offer them, take the newest any peer has, rebuild DDP on the re-formed group.
            state = group.recover(state_of(model, opt, step), error)
            model, opt, step = *build(state), state["step"]
    return list(model.parameters())


def killed_torchrun_run(args, ckpt_dir):
    """Start torchrun, kill one worker at a random moment, let torchrun restart the group."""
    cmd = ["--standalone", "--nproc-per-node", str(args.world_size), "--max-restarts", "3",
           __file__, "--steps", str(args.steps), "--checkpoint-every", str(args.checkpoint_every),
           "--checkpoint-dir", ckpt_dir]
    log("2. the same under torchrun --max-restarts 3, one worker killed at a random moment:\n"
        "   $ TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun " + " ".join(cmd))
    done, killed_at, lines = run_and_kill(  # after the first checkpoint, before the end
        [sys.executable, "-m", "torch.distributed.run", *cmd], os.path.join(ckpt_dir, "progress"),
        random.randint(args.checkpoint_every + 1, args.steps - 2),
        env=dict(os.environ, DIST_SGD_DATASET=args.data, TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1"))
    back_at, line = next((t, line) for t, line in lines if "resumed from step" in line)
    load_checkpoint(ckpt_dir, final := Net(), restore_rng=False)  # its last checkpoint's weights
    return {"done": done, "resumed": int(line.split("resumed from step")[1].split(",")[0]),
            "recovery_s": back_at - killed_at, "weights": list(final.parameters())}


def main():
    parser = lesson_parser(__doc__)
    parser.add_argument("--steps", type=int, help="steps to train (default 200; --quick: 24)")
    parser.add_argument("--checkpoint-every", type=int, help="steps between checkpoints")
    parser.add_argument("--checkpoint-dir", help="train once, resuming from DIR's latest")
    args = parser.parse_args()
    args.steps = args.steps or (24 if args.quick else 200)
    args.checkpoint_every = args.checkpoint_every or (8 if args.quick else 25)
    args.data = get_dataset("auto", quiet=bool(args.checkpoint_dir)).name
    if args.checkpoint_dir:  # the training run itself: what torchrun starts and restarts
        return launch(run, args.world_size, args)
    if under_torchrun():  # the story starts torchrun itself: run it as plain python
        parser.error("under torchrun, pass --checkpoint-dir DIR (one resumable training run)")
    p = args.world_size
    with tempfile.TemporaryDirectory() as tmp:
        log(f"1. {args.steps} steps on {p} ranks, never interrupted, a checkpoint every "
            f"{args.checkpoint_every} steps")
        args.checkpoint_dir = os.path.join(tmp, "a")  # for the uninterrupted run
        ref = launch(run, p, args)[0]
        killed = killed_torchrun_run(args, os.path.join(tmp, "b"))
    log(check(f"   killed after step {killed['done']}, resumed from step {killed['resumed']}: "
              "weights vs the uninterrupted run's", max_diff(killed["weights"], ref["weights"]), 0))
    victim, at = random.randrange(p), random.randint(2, args.steps - 2)
    log(f"3. peer recovery: rank {victim} killed after step {at}, a replacement joins")
    weights, events = run_with_peer_recovery(run, p, args=(args, "peer"), kill=(victim, at))
    log(check("   every rank's weights after recovery vs the uninterrupted run's",
              max(max_diff(w, ref["weights"]) for w in weights), 0.0))
    peer_s = max(t for what, _, t in events if what == "resumed") - events[0][2]  # kill->resumed
    step_s, ckpt_s, redo = ref["step_s"], ref["checkpoint_s"], killed["done"] - killed["resumed"]
    log(f"\nwhat a failure cost (a step {1e3 * step_s:.1f} ms, a checkpoint {1e3 * ckpt_s:.1f} ms):"
        f"\n   checkpoint-restart: {killed['recovery_s']:.2f} s to restart and reload, {redo} "
        f"steps redone ({redo * step_s:.2f} s)\n   peer recovery: {peer_s:.2f} s, <= 1 step redone")
    for hours in (1, 24):  # Young (1974): the interval that minimizes checkpoint + lost work
        best = (2 * ckpt_s * hours * 3600) ** 0.5
        log(f"   mean time between failures {hours:2d} h: Young's interval sqrt(2 x {ckpt_s:.3f} s"
            f" x {hours * 3600} s) = {best:.0f} s = {best / step_s:,.0f} steps")


if __name__ == "__main__":
    main()
