"""The benchmarks: every figure in figures/ measured again and redrawn (python -m dist_sgd.bench).

    __main__     the command: which measurements, in which order; --quick, --redraw
    common       what every benchmark shares: its CSV, running one measurement, Skip
    plots        the look every figure shares (axes, colours)
    steps        the one training step every benchmark times, synchronized each way
    nodes        running a measurement inside emulated nodes (netscale, nettrain, netaccuracy)
    p2p          figure 2: point-to-point latency and bandwidth, alpha and beta fitted
    allreduce    figure 1: all-reduce bus bandwidth, our algorithms vs gloo
    scaling      figure 3: samples per second and efficiency vs world size
    breakdown    figure 4: where a step's time goes
    ddp          our DDP vs torch's: step time, bucket sweep, backward timeline
    comparison   lesson 09's ways to train side by side
    cluster      lesson 11: 2 nodes on a 1 Gbit/s link
    compress     lesson 12: compression hooks' bytes and step time
    atscale      figure 6: the cost model at 1 to 1024 workers
    zero         lesson 13: ZeRO-1's optimizer state, bytes and time per step
    beyond       lesson 15: parameter server, local SGD, Hogwild
    fsdp         lesson 16: what FSDP holds and sends per rank, its step on a link
    netscale     all-reduce on 2-16 emulated nodes
    nettrain     weak scaling of a training step on 1-8 emulated nodes
    netaccuracy  time and bytes to accuracy on 4 slow nodes
    large_batch  lesson 18: test accuracy vs global batch for 5 lr recipes, noise scale, B_crit
    modelpar     lessons 19-20: data, tensor and pipeline parallelism on 2-4 emulated nodes
    gpu          on a CUDA GPU: our DDP and all-reduce vs torch's (refuses without one)

Each measurement module has measure(quick) -> rows, report(rows) and draw().
"""
