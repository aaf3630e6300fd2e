"""The benchmarks: every figure in figures/ measured again and redrawn (python -m dist_sgd.bench).

    __main__     the command: which measurements, in which order; --quick, --redraw
    common, plots, steps, nodes   what they share: its CSV and running one measurement, Skip;
                 the figures' look; the one training step they time; running in emulated nodes
    p2p, allreduce, scaling, breakdown   figures 1-4: point-to-point alpha and beta, all-reduce
                 bus bandwidth (ours vs gloo), samples/s vs world size, where a step's time goes
    ddp, comparison, atscale   our DDP vs torch's; lesson 09's ways side by side; figure 6,
                 the cost model at 1 to 1024 workers
    cluster, compress, zero, beyond, fsdp   lessons 11 (2 nodes), 12 (compression), 13
                 (ZeRO-1), 15 (parameter server, local SGD, Hogwild), 16 (FSDP)
    netscale, nettrain, netaccuracy   emulated nodes: all-reduce on 2-16, a training step on
                 1-8, time and bytes to accuracy on 4 slow ones
    large_batch  lesson 18: test accuracy vs global batch for 5 lr recipes, noise scale, B_crit
    modelpar     lessons 19-20: data, tensor and pipeline parallelism on 2-4 emulated nodes
    gpu          on a CUDA GPU: our DDP and all-reduce vs torch's (refuses without one)

Each measurement module has measure(quick) -> rows, report(rows) and draw().
"""
