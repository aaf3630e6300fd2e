"""Part two, lesson 13 on: sharding what every rank would otherwise hold.

    zero        ZeRO-1: the optimizer state sharded across ranks (ShardedOptimizer)
    fsdp        ZeRO-2/3: parameters, gradients and state sharded (FullyShardedDataParallel):
                the wrapper, which orders when each unit gathers, frees, reduce-scatters
    fsdp_unit   one unit: its shards gathered, freed and reduce-scattered (lesson 16's exercise)
    fsdp_guards what the wrapper refuses, before and after it shards a module
    fsdp_io     FSDP's full parameters, gathered, and its state_dicts in and out, full
"""
