"""dist-sgd: distributed data-parallel SGD rebuilt from send/recv, measured against torch.

One concept per module:
    launch          run a function on N ranks (spawned here, or under torchrun)
    wire            one collective call's sends and receives (receive first, trace, VERBOSE)
    collectives     broadcast, reduce, all_reduce, ... built only from send/recv
    allreduce       the all-reduce algorithms: naive, tree, ring, halving-doubling
    ring_pipelined  the ring tuned for big tensors (speed work beside the textbook ring)
    p2p             ping-pong latency and bandwidth
    data, models    the datasets and networks the lessons train
    partition       ShardSampler (= DistributedSampler), the tutorial's DataPartitioner
    sync, optim     average_gradients, broadcast_parameters; SGD written out
    train           the shared training / evaluation loop of lessons 06-09
    ddp, ddp_steps  DistributedDataParallel from scratch, and the steps that lead to it
    data_parallel   DataParallel from scratch (one process, replicas in threads)
    costmodel       the alpha-beta model of every all-reduce algorithm
    timing, bench   side-by-side timing; `python -m dist_sgd.bench` draws every figure
"""
