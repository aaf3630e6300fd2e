"""Lesson 09: the comparison - one network, one epoch, six ways to train it.

Everything built so far, side by side, on the same data, seeds and global batch (96):
  single process      the baseline every other way must reproduce
  average_gradients   lesson 06: all-reduce every gradient after backward
  our DDP             lesson 07: buckets, all-reduced during backward
  torch DDP           torch.nn.parallel.DistributedDataParallel
  our DataParallel    lesson 08: one process, replicas in threads
  nn.DataParallel     only with 2+ GPUs (with none, torch's just calls the module)

For each: the largest gradient difference at the first step, and weight difference after 10
steps and after the epoch, against the single process (and against torch DDP); the loss of
every global batch (one plot: the curves lie on top of each other); test accuracy after the
epoch; time per step; the share of a step spent communicating; and peak memory per process.
The code is dist_sgd/bench/comparison.py; the figures and their CSVs go to figures/
(comparison_loss.png, comparison_time.png), and the table is printed in markdown, ready for
the README.

What to expect: the differences start as float32 rounding (about 1e-8: the same numbers added
in another order). Over an epoch they grow, because a tiny difference can tip a ReLU or a
max-pool the other way and SGD carries it on; so the lesson checks the first step and the
first 10 steps tightly and shows the end-of-epoch difference and the test accuracies for what
they are. On a 2-core laptop two ranks split each batch but also share the two cores with
the communication, which here is copying through the loopback network: with this small model
both DDPs still beat one process (about 1.3x, they hide part of the communication behind
backward), average_gradients does not, and 4 ranks on 2 cores would not. The communicating share tells how much of a
step is not computing; DDP's is smaller than average_gradients' because part of its all-reduce
runs while backward still computes. Peak memory per process is mostly torch itself and the
dataset (each process loads its own copy: DDP's real memory cost on one machine); Net's
weights and gradients are 0.2 MB.

Run:
    python lessons/09_comparison.py --world-size 2        # a full epoch: a few minutes
    python lessons/09_comparison.py --quick               # 10 steps; figures to a temp folder
    torchrun --standalone --nproc-per-node 2 lessons/09_comparison.py

Exercises:
  1. Turn dropout back on (model.train() in comparison.run): which columns change, and why do
     the strategies no longer agree with each other?
  2. Run with --world-size 4 (oversubscribed on 2 cores): what happens to time per step and the
     communicating share? Predict it first with the cost model of lesson 10.
  3. Replace Net by BigNet (1.2 M parameters) in comparison.run: which strategy wins now?
  4. Why does DataParallel's peak memory grow with the number of replicas on a GPU, but barely
     on the CPU (hint: what does replicate() copy on the CPU)?
"""
import os
import sys
import tempfile

import torch

from dist_sgd.bench import common, comparison  # noqa: E402
from dist_sgd.launch import lesson_parser, log  # noqa: E402

TOLERANCE = {"max_grad_diff": 1e-5, "max_weight_diff_early": 1e-5}  # float32 rounding


def main():
    args = lesson_parser(__doc__).parse_args()
    if args.quick and "DIST_SGD_FIGURES" not in os.environ:  # rough numbers: not for figures/
        common.FIGURES_DIR = tempfile.mkdtemp(prefix="dist_sgd_quick_figures_")
    rows = comparison.measure(args.quick, args.world_size)
    if rows is None:
        return  # a torchrun rank other than 0: rank 0 reports
    log("\n" + comparison.table(rows) + "\n")
    for r in rows:  # every way must compute what one process computes
        for key, tol in TOLERANCE.items():
            torch.testing.assert_close(torch.tensor(r[key]), torch.tensor(0.0), rtol=0, atol=tol,
                                       msg=f"{r['strategy']}: {key} = {r[key]:.2e} > {tol}")
    log(f"checked: every strategy within {TOLERANCE['max_grad_diff']:g} of the single process's "
        f"gradients at step 1 and of its weights after {comparison.EARLY_STEPS} steps "
        f"(largest: {max(r['max_grad_diff'] for r in rows):.2e}, "
        f"{max(r['max_weight_diff_early'] for r in rows):.2e}).")
    if rows[0]["steps"] > comparison.EARLY_STEPS:
        log(f"After all {rows[0]['steps']} steps the largest weight difference is "
            f"{max(r['max_weight_diff'] for r in rows):.2e}: the same rounding, carried on and "
            "amplified (a ReLU or max-pool that tips the other way), not a bug - compare the "
            "test accuracies.")
    ddp = {r["strategy"]: r for r in rows}
    if "our DDP" in ddp and "torch DDP" in ddp:
        log(f"our DDP vs torch DDP, time per step: {ddp['our DDP']['step_ms']:.2f} ms vs "
            f"{ddp['torch DDP']['step_ms']:.2f} ms "
            f"(ratio {ddp['our DDP']['step_ms'] / ddp['torch DDP']['step_ms']:.2f})")
    for path in comparison.draw():
        log(f"wrote {path}")


if __name__ == "__main__":
    main()
