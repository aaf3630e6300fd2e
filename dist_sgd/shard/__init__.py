"""Part two, lesson 13 on: sharding what every rank would otherwise hold.

    zero        ZeRO-1: the optimizer state sharded across ranks (ShardedOptimizer)
    fsdp        ZeRO-2/3: parameters, gradients and state sharded (FullyShardedDataParallel);
                its units gather, free and reduce-scatter, the wrapper orders them (lesson 16)
    fsdp_io     FSDP's full parameters, gathered, and its state_dicts in and out, full
"""
