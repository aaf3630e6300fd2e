"""Part one's end and part two's start, lessons 10-11: what scaling costs, and where.

    costmodel   the alpha-beta(-gamma) cost of every all-reduce algorithm and of a step
    parallel_cost   what splitting the model costs: bytes sent and state held (lessons 19-20)
    cluster     several nodes on one machine: a bridge, links shaped to a rate, a command
                run once per node (python -m dist_sgd.scale.cluster --nodes N --rate R -- CMD)
    node_processes  what a cluster runs in its nodes: started, streamed, waited for, stopped
    netns       the Linux plumbing under it: network namespaces made and removed, their
                TCP's congestion control, the processes inside them
    summaries   what the network figures' CSVs stand for: the numbers lessons 10 and 12 quote
"""
