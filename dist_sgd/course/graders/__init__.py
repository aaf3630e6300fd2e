"""One grader per exercise, named as the exercise (see dist_sgd.course.grade for how a case is
written and run): ring_all_reduce (lesson 04), average_gradients (06),
ShardSampler (05), SGD (06), LocalSGD (15)."""
