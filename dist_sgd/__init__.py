"""dist-sgd: distributed data-parallel SGD rebuilt from send/recv, measured against torch.

One folder per part of the story; the lesson number tells where its reused code lives:

    comm/       lessons 02-04: point to point, every collective, the all-reduce algorithms
    sgd/        lessons 00, 05, 06: data, models, sharding, SGD, average_gradients
    ddp/        lessons 07-09, 12: DDP in three steps, DataParallel, compression hooks
    scale/      lessons 10-11: the cost model, several nodes on one machine
    shard/      lessons 13, 16: ZeRO, FSDP
    faults/     lessons 14, 17: checkpoints, recovery when a rank dies, elastic training
    beyond/     lesson 15: parameter server, local SGD / DiLoCo, Hogwild
    large_batch/  lesson 18: warmup schedule, LARS, the gradient noise scale, SyncBatchNorm
    parallel/   lessons 19-20: the model split: pipeline and tensor parallelism
    course/     every lesson: write a piece yourself, graded by the same proofs
    plumbing/   what everything stands on (launch, rank, check, timing, figures): read it last
    bench/      `python -m dist_sgd.bench` measures and draws every figure

Nothing is re-exported: import a name from the module that defines it, e.g.
`from dist_sgd.ddp.ddp import DistributedDataParallel`.
"""
