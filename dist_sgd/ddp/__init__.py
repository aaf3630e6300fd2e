"""Part one, lessons 07-09, and compression (lesson 12): DDP and DataParallel from scratch.

    steps           steps 1 and 2 of lesson 07: NaiveDDP (average after backward), HookDDP
    bucketed        step 3: BucketedDDP, the core (buckets in torch's layout, launched in order)
    ddp             DistributedDataParallel: torch's interface around the core
    hooks           what the wrappers need from autograd: per-parameter gradient hooks, the
                    end of backward
    grad_bucket     GradBucket: one bucket as a communication hook sees it (torch's methods)
    arguments       torch's DDP constructor arguments: accepted with its meaning, or refused
    compress        communication hooks: fp16, PowerSGD with error feedback (lesson 12)
    data_parallel   DataParallel: one process, replicas in threads (lesson 08)
"""
