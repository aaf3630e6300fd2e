"""Starts each replica's thread and joins it before starting the next: threads, but one at a
time, so the replicas never run together and p devices are no faster than one. Start every
thread first, then join them all.

Written as changes to the reference (dist_sgd/course/skeleton.reference): each (old, new)
replaces text that occurs once in it, so the wrong version follows the reference as it changes."""

CAUGHT_BY = "the replicas run at once, each in a thread: 3 forwards meet at a barrier"
HINT = "run the replicas at the same time, one thread each"
PATCH = [
    ("import time\n",
     "import threading\n"
     "import time\n"),
    ("        t2 = time.perf_counter()\n"
     "        outputs = parallel_apply(replicas, ins, self.devices, kws)\n"
     "        t3 = time.perf_counter()\n"
     "        out = gather(outputs, self.output_device, self.dim)\n"
     "        t4 = time.perf_counter()\n"
     '        self.last_times = {"scatter": t1 - t0, "replicate": t2 - t1, "apply": t3 - t2,\n'
     '                           "gather": t4 - t3}\n'
     "        return out\n",
     "        outs = [None] * len(ins)\n"
     "        grad = torch.is_grad_enabled()\n"
     "\n"
     "        def run(i):\n"
     "            with torch.set_grad_enabled(grad):\n"
     "                outs[i] = replicas[i](*ins[i], **kws[i])\n"
     "        for i in range(len(ins)):\n"
     "            t = threading.Thread(target=run, args=(i,))\n"
     "            t.start()\n"
     "            t.join()\n"
     "        return gather(outs, self.output_device, self.dim)\n"),
]
