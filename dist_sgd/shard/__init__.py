"""Part two, lesson 13 on: sharding what every rank would otherwise hold.

    zero        ZeRO-1: the optimizer state sharded across ranks (ShardedOptimizer)
"""
