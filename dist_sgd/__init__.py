"""dist-sgd: distributed data-parallel SGD rebuilt from send/recv, measured against torch.

One concept per module:
    launch          run a function on N ranks (spawned here, or under torchrun)
    collectives     broadcast, reduce, all_reduce, ... built only from send/recv
    data, models    the datasets and networks the lessons train
    partition       ShardSampler (= DistributedSampler), the tutorial's DataPartitioner
    sync, optim     average_gradients, broadcast_parameters; SGD written out
    ddp, data_parallel   DistributedDataParallel and DataParallel from scratch
"""
