"""Lesson 15: beyond synchronous all-reduce: parameter server, async SGD, Hogwild, local SGD.

Every lesson so far ran synchronous data-parallel SGD: all ranks compute a gradient, one
all-reduce averages it, all ranks take the same step. It is one point in a design space:

  parameter server (PS)   rank 0 holds the weights; workers pull them, push gradients
                          (dist_sgd/beyond/ps.py, on send/recv). Synchronous: the server waits
                          for every worker, averages, steps: all-reduce SGD in one place.
  asynchronous PS         the server applies each gradient the moment it arrives (Downpour
                          SGD, Dean et al. 2012). Nobody waits for a slow worker, but a
                          gradient may have been computed on weights that are k updates old:
                          its *staleness* k.
  Hogwild!                processes on one machine update one model in shared memory with no
                          lock at all (Recht et al. 2011; dist_sgd/beyond/hogwild.py).
  local SGD               every rank takes H steps on its own copy, then the copies are
                          averaged (dist_sgd/beyond/local_sgd.py): H times fewer bytes. DiLoCo
                          (Douillard et al. 2023) adds an outer Nesterov step to the average.

Here every one of them trains dist_sgd.sgd.models.Net on the same data (Fashion-MNIST when it is
installed) with the same global batch and learning rate, in one group of processes: rank 0 is
the server (it sits out the all-reduce methods), ranks 1..W are the workers. One worker is
made 3x slower on purpose (a straggler) in two runs, to show what synchronous training pays
for its slowest member. The checks: sync PS == all-reduce SGD, local SGD with H = 1 ==
all-reduce SGD (weights after CHECK_STEPS steps, float32 rounding).

Every method sees the same number of training items. The synchronous ones take one step per
global batch of 60; async PS and Hogwild take one step per worker batch of 30 (twice as many,
smaller steps), so they use lr / W: the same learning rate per item (the linear scaling rule
of lesson 06). With the full lr they would move twice as far per item.

What to expect on a 2-core laptop: 3 processes share 2 cores, so no method is fast; compare
them with each other. The straggler sets the pace of sync PS; async PS keeps the fast worker
busy and gets more gradients per second, paying with stale gradients (the histogram). Bytes
per step: all-reduce sends 2(p-1)/p of the model per worker (the ring's count, what gloo's
ring moves); a PS sends the model twice per worker (gradient up, weights down), all through
rank 0's link; local SGD sends all-reduce's bytes / H; Hogwild sends none (shared memory)
but works only on one machine. An async PS may apply a gradient or two past max_updates:
those were already on their way when it said "enough". With momentum 0.9 the asynchronous
methods are fragile: stale gradients act like extra momentum (Mitliagkas et al. 2016,
"Asynchrony begets momentum"); with the full lr instead of lr / W the async PS diverged in
our runs. Exercise 1 is another cure.
Figures (loss against steps and wall time, bytes, staleness): the figures' benchmark (README).

CPU only: a parameter server's messages carry tags and are received from whichever worker
sends first (irecv without a source), which gloo does and NCCL does not: the ranks use gloo and
CPU tensors wherever they run (and world size 1 is refused: a server needs a worker).

Run:
    python lessons/15_beyond_sync.py                   # 1 server + 2 workers, 150 steps each
    python lessons/15_beyond_sync.py --quick           # 20 steps, a 1000-image test set
    torchrun --standalone --nproc-per-node 3 lessons/15_beyond_sync.py
    # on 3 emulated nodes behind 100 Mbit/s links (lesson 11; root), nothing here changed:
    sudo python -m dist_sgd.scale.cluster --nodes 3 --rate 100mbit -- 'torchrun --nnodes \\
        $NNODES --node-rank $NODE_RANK --nproc-per-node 1 --master-addr $MASTER_ADDR \\
        --master-port $MASTER_PORT lessons/15_beyond_sync.py --quick'

Exercises:
  0. Write local SGD's averaging yourself: `python3 -m dist_sgd.course start LocalSGD`, then
     `python3 -m dist_sgd.course check LocalSGD` compares the weights with torch's
     PeriodicModelAverager at world sizes 1-4 (and H = 1 with all-reduce SGD), and
     `DIST_SGD_MINE=mine python3 lessons/15_beyond_sync.py` runs this lesson on yours.
  1. Pass staleness_aware=True to the async server: lr / staleness. What happens to the loss?
  2. Make the straggler 10x slower (SLOW): which method suffers, which does not notice?
  3. Give LocalSGD outer_lr=0.7, outer_momentum=0.9, nesterov=True (DiLoCo) with H = 16.
"""
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from dist_sgd.beyond import ps
from dist_sgd.plumbing.check import check, max_diff
from dist_sgd.sgd.data import get_dataset
from dist_sgd.beyond.hogwild import hogwild
from dist_sgd.plumbing.launch import launch, lesson_parser
from dist_sgd.plumbing.rank import log
from dist_sgd.beyond.local_sgd import LocalSGD
from dist_sgd.sgd.models import Net, init_weights
from dist_sgd.sgd.train import evaluate, per_rank_batch

GLOBAL_BATCH, LR, MOMENTUM, SLOW, CHECK_STEPS = 60, 0.05, 0.9, 3, 10  # 60 splits over 1-6 workers


def fresh(seed_for_dropout):
    torch.manual_seed(0)  # the same initial weights everywhere
    model = Net()
    model.apply(init_weights)
    torch.manual_seed(seed_for_dropout)  # dropout masks: per worker, the same in every method
    return model


def run(rank, world_size, args, data):
    servers, workers = ps.roles(world_size)  # [0] and [1, .., W]
    group = dist.new_group(workers)  # every rank must create it; only workers use it
    W = len(workers)
    me, b = (workers.index(rank) if rank in workers else 0), per_rank_batch(GLOBAL_BATCH, W)
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(0))

    def gradient(model, k, slow):  # my part of global batch k: forward, backward
        start, first = time.perf_counter(), (k * GLOBAL_BATCH) % (len(order) - GLOBAL_BATCH + 1)
        x, y = data[order[first + me * b:first + (me + 1) * b]]
        model.zero_grad()
        loss = F.nll_loss(model(x), y)
        loss.backward()
        if slow and me == W - 1:  # the straggler: its step takes SLOW times as long
            time.sleep((SLOW - 1) * (time.perf_counter() - start))
        return loss.item()

    def synchronous(period=None):  # all-reduce SGD (period None) or local SGD every `period`
        model = fresh(rank)
        opt, local = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM), None
        if period:
            local = LocalSGD(model.parameters(), period=period, group=group)
        rec, start, snapshot = [], time.perf_counter(), None
        for k in range(args.steps):
            loss = gradient(model, k, slow=False)
            if local is None:  # average the gradients: one all-reduce per step
                for p in model.parameters():
                    dist.all_reduce(p.grad, group=group)
                    p.grad /= W
            opt.step()
            if local is not None:
                local.step()  # average the weights, every `period` steps
            rec.append((time.perf_counter() - start, loss))
            snapshot = ps.flat_weights(model).clone() if k + 1 == CHECK_STEPS else snapshot
        n = sum(p.numel() * p.element_size() for p in model.parameters())
        sent = local.bytes_per_sync * local.syncs if local else 2 * (W - 1) / W * n * args.steps
        return {"rec": rec, "bytes": sent, "weights": ps.flat_weights(model), "check": snapshot}

    def parameter_server(mode, slow):
        model = fresh(rank)
        # The same number of items either way: async steps are W times smaller.
        updates = args.steps if mode == "sync" else args.steps * W
        if rank in servers:
            # async: a step of GLOBAL_BATCH / W items gets lr / W (the same lr per item)
            return ps.ParameterServer(model, servers, workers, LR if mode == "sync" else LR / W,
                                      MOMENTUM, mode=mode, max_updates=updates).serve()
        worker, rec, snapshot, k = ps.Worker(model, servers), [], None, 0
        start = time.perf_counter()
        while worker.pull():  # the newest weights; False once the server has had enough
            snapshot = ps.flat_weights(model).clone() if worker.version == CHECK_STEPS else snapshot
            loss = gradient(model, k, slow)
            worker.push()  # my gradient, to the server
            rec.append((time.perf_counter() - start, loss))
            k += 1
        stats = worker.finish()
        return {"rec": rec, "bytes": stats["bytes_sent"], "weights": ps.flat_weights(model),
                "check": snapshot}

    runs = {"all-reduce SGD": lambda: synchronous(),
            "sync PS": lambda: parameter_server("sync", slow=False),
            "sync PS, 1 slow worker": lambda: parameter_server("sync", slow=True),
            "async PS, 1 slow worker": lambda: parameter_server("async", slow=True),
            **{f"local SGD H={h}": (lambda h=h: synchronous(period=h)) for h in (1, 4, 16)}}
    out = {}
    for name, method in runs.items():
        if rank in workers or "PS" in name:
            out[name] = method()
        dist.barrier()  # one method at a time: they must not share the cores
    return out


def main():
    args = lesson_parser(__doc__, world_size=3).parse_args()
    steps = args.steps = 20 if args.quick else 150
    # The first steps * GLOBAL_BATCH training images: what every method sees, loaded once here.
    data = TensorDataset(*(t[:steps * GLOBAL_BATCH] for t in get_dataset("auto").tensors))
    results = launch(run, args.world_size, args, data, backend=args.backend or "gloo")
    if results is None:
        return
    servers, workers = ps.roles(len(results))
    test = get_dataset("auto", train=False)
    if args.quick:
        test = TensorDataset(*(t[:1000] for t in test.tensors))
    methods = {name: [results[w][name] for w in workers] for name in results[workers[0]]}
    for name, runs in methods.items():  # server-side bytes count too: what it sends back
        runs[0]["bytes"] += results[0].get(name, {}).get("bytes_sent", 0)

    # Hogwild: W processes, one shared model, no process group at all.
    model = fresh(0)
    hog = hogwild(model, data, processes=len(workers), steps=steps,
                  batch_size=GLOBAL_BATCH // len(workers), lr=LR / len(workers), momentum=MOMENTUM)
    methods["Hogwild"] = [{"rec": list(zip(t, l)), "bytes": 0, "weights": ps.flat_weights(model)}
                          for t, l in zip(hog["times"], hog["losses"])]

    log(f"\n{len(workers)} workers, global batch {GLOBAL_BATCH}, lr {LR}, momentum {MOMENTUM}, "
        f"{steps} global batches of data per method; worker {workers[-1]} is {SLOW}x slower in "
        "the 'slow' runs\n")
    log(f"{'method':26s} {'wall s':>7s} {'items/s':>8s} {'loss first->last 5':>19s} "
        f"{'test acc':>8s} {'KiB sent/step':>13s}")
    for name, runs in methods.items():
        wall = max(r["rec"][-1][0] for r in runs)
        losses = [sum(loss for _, loss in r["rec"][i:i + 5]) / len(r["rec"][i:i + 5])
                  for r in runs for i in (0, max(0, len(r["rec"]) - 5))]
        net = Net()
        torch.nn.utils.vector_to_parameters(runs[0]["weights"], net.parameters())
        acc = evaluate(net, test)["accuracy"]
        kib = sum(r["bytes"] for r in runs) / steps / 1024
        log(f"{name:26s} {wall:7.2f} {steps * GLOBAL_BATCH / wall:8.0f} "
            f"{sum(losses[::2]) / len(runs):8.3f} -> {sum(losses[1::2]) / len(runs):6.3f} "
            f"{100 * acc:7.1f}% {kib:13.1f}")

    stale = results[0]["async PS, 1 slow worker"]["staleness"]
    log(f"\nasync PS: staleness of its {len(stale)} updates (updates the gradient missed):")
    for s in range(max(stale) + 1):
        log(f"  {s:3d} {'#' * round(60 * stale.count(s) / len(stale)):60s} {stale.count(s)}")

    ref = methods["all-reduce SGD"][0]["check"]
    log("\n" + check(f"sync PS vs all-reduce SGD (weights after {CHECK_STEPS} steps)",
                     max_diff(methods["sync PS"][0]["check"], ref), 1e-5))
    log(check(f"local SGD H=1 vs all-reduce SGD (weights after {CHECK_STEPS} steps)",
              max_diff(methods["local SGD H=1"][0]["check"], ref), 1e-5))


if __name__ == "__main__":
    main()
