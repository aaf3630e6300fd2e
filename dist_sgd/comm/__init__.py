"""Part one, lessons 02-04: messages and collectives, built from send/recv.

    p2p             ping-pong latency and bandwidth (lesson 02)
    wire            one collective call's sends and receives: receives first, trace, VERBOSE
    collectives     broadcast, reduce, all_reduce, all_gather, gather, scatter, reduce_scatter,
                    barrier, built only from isend/irecv (lesson 03)
    textbook        broadcast, all_gather, reduce_scatter as short as a textbook's, without
                    the wire (lesson 03 runs them; the course's exercises)
    allreduce       the all-reduce algorithms: naive, tree, ring, halving-doubling (lesson 04)
    ring_pipelined  the ring tuned for big tensors (speed work beside the textbook ring)
    ringviz         the ring replayed from its trace: a table and a GIF
    flat            many tensors as one flat buffer and back (buckets, flat all-reduces)
    counted         collectives started asynchronously, their bytes logged (FSDP, lessons)
    ordered         collectives issued in one order per process: in_order, start_all_reduce
                    (DDP's and FSDP's, also from callbacks and a helper thread)
"""
