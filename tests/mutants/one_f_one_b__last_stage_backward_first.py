"""With no warm-up (the last stage) the pairs are written backward first, B i then F i: "the
last stage can go backward right away". Its loss needs the micro-batch's forward: on the
pipeline the last stage would run a backward for an output it never computed.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""
CAUGHT_BY = "the order on every stage, step by step, m = 1, p and p + 3"
HINT = "a micro-batch's backward needs its forward"
PATCH = [('        order += [("F", warmup + i), ("B", i)]\n',
          '        order += [("F", warmup + i), ("B", i)] if warmup else [("B", i), ("F", i)]\n')]
