"""Part three, lessons 19-20: when the model is split across ranks, not the data.

    pipeline    pipeline parallelism: PipelineStage, ScheduleGPipe, Schedule1F1B (torch's
                interface), stages joined by send/recv; the orders GPipe and 1F1B
    pipeline_meter  what a step did, beside the schedule: its trace, the activations held at
                the peak (micro-batches, bytes autograd saved); lesson 19's picture of it
    tensor      tensor parallelism, Megatron's: f and g as autograd Functions on our
                all_reduce, ColumnParallelLinear, RowParallelLinear
"""
