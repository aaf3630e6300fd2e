"""Part three, lessons 19-20: when the model is split across ranks, not the data.

    pipeline    pipeline parallelism: PipelineStage, ScheduleGPipe, Schedule1F1B (torch's
                interface), stages joined by send/recv, each step's trace and held activations
    tensor      tensor parallelism, Megatron's: f and g as autograd Functions on our
                all_reduce, ColumnParallelLinear, RowParallelLinear
"""
