"""dist-sgd: distributed data-parallel SGD rebuilt from send/recv, measured against torch.

One concept per module:
    launch          run a function on N ranks (spawned here, or under torchrun); max_restarts
    check           max_diff and the check line every lesson prints
    wire            one collective call's sends and receives (receive first, trace, VERBOSE)
    collectives     broadcast, reduce, all_reduce, ... built only from send/recv
    allreduce       the all-reduce algorithms: naive, tree, ring, halving-doubling
    ring_pipelined  the ring tuned for big tensors (speed work beside the textbook ring)
    ringviz         the ring replayed from its trace: a table and a GIF
    p2p             ping-pong latency and bandwidth
    data, models    the datasets and networks the lessons train
    partition       ShardSampler (= DistributedSampler), the tutorial's DataPartitioner
    sync, optim     average_gradients, broadcast_parameters; SGD written out
    train           what lessons reuse around a training loop (batch sizes, loaders, evaluate)
    ddp_steps       DDP steps 1 and 2: average after backward, per-parameter hooks
    ddp, ddp_hooks, ddp_args
                    step 3: bucketed DistributedDataParallel (core + extras), comm hooks,
                    the one private torch call, torch's constructor arguments
    data_parallel   DataParallel from scratch (one process, replicas in threads)
    cluster         several nodes on one machine: namespaces, a bridge, shaped links
    compress        DDP communication hooks: fp16, PowerSGD with error feedback
    zero            ZeRO-1: the optimizer state sharded across ranks
    checkpoint      checkpoints that resume bit for bit; peer_recovery, chaos: a dead rank
    ps, local_sgd, hogwild
                    a parameter server (sync, async), local SGD / DiLoCo, Hogwild
    costmodel       the alpha-beta model of every all-reduce algorithm and a parameter server
    timing, figures side-by-side timing; the figures' CSVs
    bench           `python -m dist_sgd.bench` measures and draws every figure
"""
