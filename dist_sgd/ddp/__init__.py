"""Part one, lessons 07-09, and compression (lesson 12): DDP and DataParallel from scratch.

    steps           steps 1 and 2 of lesson 07: NaiveDDP (average after backward), HookDDP
    ddp             step 3: BucketedDDP (the core), DistributedDataParallel (torch's interface)
    hooks           what the wrappers need around autograd: the end of backward, GradBucket
    arguments       torch's DDP constructor arguments: accepted with its meaning, or refused
    compress        communication hooks: fp16, PowerSGD with error feedback (lesson 12)
    data_parallel   DataParallel: one process, replicas in threads (lesson 08)
"""
