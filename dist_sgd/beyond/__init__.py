"""Part two, lesson 15: beyond synchronous all-reduce.

    ps          a parameter server on send/recv (sync, async, sharded)
    local_sgd   local SGD (= PeriodicModelAverager) and DiLoCo's outer step
    hogwild     Hogwild on a shared-memory model
"""
