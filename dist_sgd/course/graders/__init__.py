"""One grader per exercise, named as the exercise (see dist_sgd.course.grade for how a case is
written and run): ring_sum (lesson 02), broadcast, all_gather and reduce_scatter (03),
ring_all_reduce (04), ShardSampler (05), average_gradients and SGD (06), hook_ddp and
bucketed_ddp (07), DataParallel (08), fp16_compress_hook and powerSGD_hook (12),
ShardedOptimizer (13), save_checkpoint (14), LocalSGD (15), fsdp_unit (16)."""
