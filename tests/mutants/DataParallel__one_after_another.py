"""Runs the replicas one after the other in the calling thread: the output and gradients are
right, but nothing runs at once, so on p devices a step takes as long as on one. The idea
of DataParallel is one thread per replica, all running together (parallel_apply).

Written as changes to the reference (dist_sgd/course/skeleton.reference): each (old, new)
replaces text that occurs once in it, so the wrong version follows the reference as it changes."""

CAUGHT_BY = "the replicas run at once, each in a thread: 3 forwards meet at a barrier"
HINT = "run the replicas at the same time, one thread each"
PATCH = [
    ("        t2 = time.perf_counter()\n"
     "        outputs = parallel_apply(replicas, ins, self.devices, kws)\n"
     "        t3 = time.perf_counter()\n"
     "        out = gather(outputs, self.output_device, self.dim)\n"
     "        t4 = time.perf_counter()\n"
     '        self.last_times = {"scatter": t1 - t0, "replicate": t2 - t1, "apply": t3 - t2,\n'
     '                           "gather": t4 - t3}\n'
     "        return out\n",
     "        outs = [r(*i, **k) for r, i, k in zip(replicas, ins, kws)]\n"
     "        return gather(outs, self.output_device, self.dim)\n"),
]
