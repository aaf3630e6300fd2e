"""Part one, lessons 00, 05 and 06: the training loop, sharded data, averaged gradients.

    data        MNIST / Fashion-MNIST / synthetic data, and why which one was used
    models      Net (the classic MNIST convnet), BigNet, MLP, Awkward (a test model)
    partition   ShardSampler (= DistributedSampler), the tutorial's DataPartitioner
    optim       SGD written out (= torch.optim.SGD, step for step)
    sync        average_gradients, broadcast_parameters
    train       what a training loop reuses: per_rank_batch, shard_loader, evaluate, scaled_lr
"""
