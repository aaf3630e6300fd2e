"""One grader per exercise, named as the exercise (see dist_sgd.course.grade for how a case is
written and run): ring_all_reduce (lesson 04), average_gradients (06), hook_ddp
and bucketed_ddp (07)."""
