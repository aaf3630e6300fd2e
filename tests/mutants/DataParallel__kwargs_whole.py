"""Scatters the positional inputs but hands every replica the whole kwargs: a keyword tensor
of the batch (a mask) then has all the rows while the replica's x has its chunk, and the
shapes do not match. torch scatters kwargs as it scatters inputs (scatter_kwargs).

Written as changes to the reference (dist_sgd/course/skeleton.reference): each (old, new)
replaces text that occurs once in it, so the wrong version follows the reference as it changes."""

CAUGHT_BY = "forward and backward, 7 rows over 3 replicas: one process's output and gradients"
PATCH = [
    ("        t2 = time.perf_counter()\n"
     "        outputs = parallel_apply(replicas, ins, self.devices, kws)\n"
     "        t3 = time.perf_counter()\n"
     "        out = gather(outputs, self.output_device, self.dim)\n"
     "        t4 = time.perf_counter()\n"
     '        self.last_times = {"scatter": t1 - t0, "replicate": t2 - t1, "apply": t3 - t2,\n'
     '                           "gather": t4 - t3}\n'
     "        return out\n",
     "        kws = [kwargs] * len(ins)\n"
     "        outs = parallel_apply(replicas, ins, self.devices[:len(ins)], kws)\n"
     "        return gather(outs, self.output_device, self.dim)\n"),
]
