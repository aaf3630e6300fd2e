"""Lesson 17: elastic training - a node is lost and the job goes on smaller; it comes back, and
the job grows again.

Lesson 14 survived a dead worker by restarting the same group. Real clusters lose whole
machines (a spot instance reclaimed, a host rebooted) and get them back later. torchrun's
elastic mode handles both: with `--nnodes 2:3` the job runs on 2 or 3 nodes, and a c10d
rendezvous (a key-value store that one node's torchrun hosts) decides who is in. When a node
vanishes, the survivors' next collective times out, their workers fail, torchrun stops them
(a restart, counted against --max-restarts) and the agents meet again without it. When a node
joins, the running agents see it waiting, stop their workers (not counted) and meet again with
it. Either way every worker starts afresh, so training goes on from the latest checkpoint, at
another world size.

So the checkpoint must not depend on the world size (dist_sgd/faults/checkpoint.py): model and
optimizer saved whole, the data position as global items consumed, and the global batch fixed
at 60: every rank takes every world_size-th item of the same global batch (20 each on 3 nodes,
30 on 2) and scales its summed loss by world_size / 60, so that the averaged gradient is the
global batch's mean at any size. The steps are the same; only the float32 sums are split
another way (60 terms in 3 partial sums, or in 2), which rounds differently: one step at
another size moves the weights by ~1e-8 from an uninterrupted run's, never bit for bit, and
training may grow that (a ReLU that flips sends the runs apart, as lesson 09 shows; here the
distance stays below 1e-6 over 200 steps). So the lesson checks two things: the cluster's run
equals, bit for bit, the same world sizes at the same steps replayed on this machine (nothing
was lost or done twice), and a run through changes stays within rounding of the uninterrupted
one; it prints the final distance.
No dropout here: a mask drawn per rank would depend on the split.

The lesson builds 4 emulated nodes (lesson 11's network namespaces, 100 Mbit/s links): nodes
0-2 train, node 3 can host a store. In one run you watch:
  1. node 2 is removed mid-run (its link cut, then every process SIGKILLed: a machine that
     vanished): the job continues on 2 nodes; node 2 comes back: the job grows to 3 again;
  2. node 0, whose torchrun hosts the rendezvous store, is removed: the store goes with it. The
     other nodes' workers fail, but their torchrun agents keep asking the lost host whether
     nodes wait to join, and the request never returns: the job neither goes on nor ends (the
     lesson stops it after --give-up seconds, 60 by default);
  3. the remedy: the store on a host that does not train (node 3 here; etcd or a small store
     service on a real cluster): now node 0 is lost like any other node, and the job goes on.
Each step takes at least --step-time seconds on the nodes (a sleep standing for a real model's
compute: here a step is a few milliseconds, and a change must cost less than a job's length).
--world-size P trains on P nodes (nnodes P-1:P; default 3). For each change it prints what it
cost. torchrun's timeouts are shortened (detection of a dead
node 15 s -> 3 s, last call 30 s -> 1 s; see dist_sgd/faults/elastic.py) and the collectives
time out after 10 s: real jobs keep longer ones. Without root (no namespaces) the lesson runs
the arithmetic alone on this machine (P ranks, then P-1, then P, through checkpoints) and shows
the numbers recorded in figures/elastic.csv.

CPU only: the nodes are emulated (network namespaces of this machine) and the job's ranks use
gloo and CPU tensors, GPUs or not.

Run:
    sudo python lessons/17_elastic.py
    sudo python lessons/17_elastic.py --quick
    # what each node runs (the lesson prints it with its own values):
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --nnodes 2:3 --nproc-per-node 1 \\
        --max-restarts 3 --rdzv-backend c10d --rdzv-endpoint node0:29400 --rdzv-id elastic \\
        lessons/17_elastic.py --checkpoint-dir /shared/ckpt

Exercises:
  1. Remove node 1 instead of node 2: which node hosts rank 0 afterwards, and does it matter?
  2. Set --checkpoint-every 50: how many steps does each change repeat now?
  3. Give the collectives a 60 s timeout (the launch call in main): what does removing a node
     cost then, and which part of the cost grew?
"""
import copy
import os
import tempfile
import time

import torch
import torch.nn.functional as F

from dist_sgd.faults.chaos import write_step
from dist_sgd.faults.checkpoint import load_checkpoint, save_checkpoint
from dist_sgd.faults.elastic import Watch, run_act, shown, sizes_over_steps, torchrun_elastic
from dist_sgd.plumbing.check import check, max_diff
from dist_sgd.plumbing.figures import machine_facts, read_csv, write_csv
from dist_sgd.plumbing.launch import launch, lesson_parser
from dist_sgd.plumbing.rank import log, under_torchrun
from dist_sgd.scale import cluster, netns
from dist_sgd.sgd.data import get_dataset
from dist_sgd.sgd.models import MLP
from dist_sgd.sgd.optim import SGD
from dist_sgd.sgd.sync import average_gradients

GLOBAL_BATCH, SEED, LR, PORT, TIMEOUT = 60, 17, 0.05, 29400, 10.0
ROUNDING = 1e-5  # float32 sums split another way, over the 2 x checkpoint_every steps checked


def batch(step, n, rank, world_size):
    """Step `step`'s global batch (the same at every world size) and this rank's share of it."""
    epoch, k = divmod(step, n // GLOBAL_BATCH)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(SEED + epoch))
    return order[k * GLOBAL_BATCH:(k + 1) * GLOBAL_BATCH][rank::world_size]


def run(rank, world_size, args):
    """Train up to step args.stop from the latest checkpoint, whatever world size saved it."""
    images, labels = get_dataset(args.data, quiet=True).tensors
    torch.manual_seed(SEED)
    model = MLP(hidden=args.hidden)
    opt = SGD(model.parameters(), lr=LR, momentum=0.9)
    start = time.perf_counter()
    state = load_checkpoint(args.checkpoint_dir, model, opt)
    step = state["step"] if state else 0
    log(f"world size {world_size}: " + (f"{state['resumed']} (reload "
        f"{time.perf_counter() - start:.2f} s)" if state else "starting at step 0"))
    while step < args.stop:
        began, idx = time.perf_counter(), batch(step, len(images), rank, world_size)
        opt.zero_grad()
        loss = F.nll_loss(model(images[idx]), labels[idx], reduction="sum")
        (loss * world_size / GLOBAL_BATCH).backward()  # averaged: the global batch's mean
        average_gradients(model, flat=True)
        opt.step()
        step += 1
        write_step(os.path.join(args.checkpoint_dir, "progress"), step)  # for the story
        if step % args.checkpoint_every == 0 or step == args.stop:
            save_checkpoint(args.checkpoint_dir, step, model, opt, items=step * GLOBAL_BATCH)
            log(f"step {step} at world size {world_size}")
        time.sleep(max(0.0, args.step_time - (time.perf_counter() - began)))  # "compute"


def final_weights(args, folder):
    load_checkpoint(folder, model := MLP(hidden=args.hidden), restore_rng=False)
    return list(model.parameters())


def replay(args, folder, schedule):
    """Train on this machine through the same world sizes, [(size, until step), ...]."""
    here = copy.copy(args)
    here.checkpoint_dir, here.step_time = folder, 0.0
    for here.world_size, here.stop in schedule:
        launch(run, here.world_size, here, backend="gloo")
    return final_weights(here, folder)


def on_the_cluster(args, tmp):
    """The acts on p training nodes and one more that can host a store: what each change cost."""
    p, q, rows = args.world_size, args.quick, []
    # (node lost, the store's host, the size the job goes on at: None, it ends); --quick: act 1
    acts = [(p - 1, "node0", p - 1), (0, "node0", None), (0, f"node{p}", p - 1)][:3 - 2 * q]
    flags = [f"--{k.replace('_', '-')}={getattr(args, k)}"
             for k in ("steps", "checkpoint_every", "hidden", "step_time")]
    with cluster.Cluster(p + 1, rate=args.rate) as c:
        watch = Watch(echo=r"world size \d+: |step \d*[05]0 |RendezvousConnectionError")
        for number, (lost, host, size) in enumerate(acts, 1):
            folder = os.path.join(tmp, f"act{number}")
            cmd = torchrun_elastic([__file__, f"--checkpoint-dir={folder}", *flags],
                                   f"{host}:{PORT}", f"{p - 1}:{p}")
            log(f"\n{number}. node {lost} lost{', then back' if number == 1 else ''}, the store "
                f"on {host}; each training node runs:\n   $ {shown(cmd)}")
            act = run_act(c, watch, cmd, range(p), lost, folder, size, back=number == 1,
                          store=p if host != "node0" else None, port=PORT,
                          after=2 * args.checkpoint_every, give_up=args.give_up)
            rows += act
            if size:  # the sizes the job ran at, from the step each one resumed from
                schedule, final = sizes_over_steps(act, p, args.steps), final_weights(args, folder)
                log(check(f"final weights (act {number}) vs {schedule} replayed here", max_diff(
                    final, replay(args, f"{tmp}/replay{number}", schedule)), 0))
                act[-1]["distance"] = d = max_diff(final, args.reference)
                log(f"   vs the uninterrupted run at {p}: {d:.1e} (float32 sums split another way)")
    log(f"namespaces left behind: {len(set(netns.ours()) & set(c.netns + [c.switch]))}")
    return rows


def describe(row):
    """One sentence on what a membership change cost (a row of run_act, or of elastic.csv)."""
    change, after = row["change"], row["after_step"]
    if row["resumed"] == "":
        return (f"{change} after step {after}: the job did not go on, and did not end either: "
                f"{row['seconds']} s later the other nodes' torchrun still waited on the lost "
                f"store's host, and were stopped ({row['exit']})")
    noticing = f" (up to {TIMEOUT:g} s of it noticing)" if "removed" in change else ""
    return (f"{change} after step {after}: resumed from step {row['resumed']} at world size "
            f"{row['world_size']}, {row['repeated']} steps repeated, {row['seconds']} s from the "
            f"change to the resumed step{noticing}, {row['reload_s']} s of it reloading")


def without_a_cluster(args, tmp, why):
    p, n, every = args.world_size, args.steps, args.checkpoint_every
    log(f"No cluster here: {why}\nThe same arithmetic here: {p} ranks, then {p - 1}, then {p}")
    schedule = [(p, n - 2 * every), (p - 1, n - every), (p, n)]  # changes late: rounding only
    log(check(f"final weights ({schedule}) vs the uninterrupted run at {p}",
              max_diff(replay(args, f"{tmp}/local", schedule), args.reference), ROUNDING))
    log(f"\nRecorded on the emulated nodes ({read_csv('elastic')[1]}):")
    return read_csv("elastic")[0]


def main():
    parser = lesson_parser(__doc__, world_size=3, save_figures=True)
    parser.add_argument("--steps", type=int, help="steps to train (default 200; --quick: 120)")
    parser.add_argument("--checkpoint-every", type=int, default=10, help="steps between them")
    parser.add_argument("--hidden", type=int, default=256, help="MLP width (gradient bytes)")
    parser.add_argument("--step-time", type=float, default=0.2, help="a step's least seconds")
    parser.add_argument("--rate", default="100mbit", help="each link's speed")
    parser.add_argument("--give-up", type=float, default=60, help="act 2: seconds until stopped")
    parser.add_argument("--checkpoint-dir", help="train once, resuming from DIR's latest")
    args = parser.parse_args()
    args.steps = args.stop = args.steps or (120 if args.quick else 200)
    args.data = get_dataset("auto", quiet=bool(args.checkpoint_dir)).name
    if args.checkpoint_dir or under_torchrun():  # one elastic training run, in a node
        return launch(run, None, args, timeout=TIMEOUT, backend="gloo")
    with tempfile.TemporaryDirectory() as tmp:
        log(f"0. the reference: {args.steps} steps at world size {args.world_size}, uninterrupted")
        args.reference = replay(args, f"{tmp}/reference", [(args.world_size, args.steps)])
        why = netns.privilege_problem()
        rows = without_a_cluster(args, tmp, why) if why else on_the_cluster(args, tmp)
    log(f"\nWhat each change cost (the collectives time out after {TIMEOUT:g} s):" +
        "".join(f"\n   {describe(row)}" for row in rows))
    if args.save_figures and not why:
        write_csv("elastic", [{k: v for k, v in r.items() if k != "at"} for r in rows],
                  facts=f"{machine_facts()}, links {args.rate}, steps of {args.step_time:g} s")


if __name__ == "__main__":
    main()
