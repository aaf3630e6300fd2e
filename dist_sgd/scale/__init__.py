"""Part one's end and part two's start, lessons 10-11: what scaling costs, and where.

    costmodel   the alpha-beta(-gamma) cost of every all-reduce algorithm and of a step
    cluster     several nodes on one machine: network namespaces, a bridge, shaped links
                (python -m dist_sgd.scale.cluster --nodes N --rate R -- CMD)
    summaries   what the network figures' CSVs stand for: the numbers lessons 10 and 12 quote
"""
