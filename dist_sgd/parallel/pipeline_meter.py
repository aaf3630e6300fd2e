"""What a pipeline step did, metered beside the schedule that runs it (parallel/pipeline.py).

    meter = Meter(stage_index, submodule.parameters())   # at the start of each step
    y = meter.forward(i, submodule, x)    # runs it, counting the bytes autograd saves for i
    meter.backward(i, run)                # runs run(), notes it, frees i's count
    meter.trace, meter.peak_held, meter.peak_bytes
    draw_trace(results, path)             # lesson 19's picture of GPipe and 1F1B

The trace is one dict per forward and backward, {"stage", "kind", "mb", "start", "end"} in
seconds from the step's start; peak_held counts the micro-batches whose activations were held
at once, peak_bytes the bytes autograd saved for them (parameters left out).
"""
import time

import torch


class Meter:
    def __init__(self, stage_index, parameters):
        self.stage_index, self.t0 = stage_index, time.perf_counter()
        self.params = {p.untyped_storage().data_ptr() for p in parameters}
        self.trace, self.saved, self.peak_held, self.peak_bytes = [], {}, 0, 0

    def forward(self, i, fn, x, then=None):
        """then(fn(x)) (then: the last stage's loss), timed; the bytes autograd saves inside
        fn counted for micro-batch i."""
        self.saved[i] = 0

        def pack(t):
            if t.untyped_storage().data_ptr() not in self.params:
                self.saved[i] += t.numel() * t.element_size()
            return t
        start = time.perf_counter()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y = fn(x)
        y = then(y) if then is not None else y
        self._note("forward", i, start)
        self.peak_held = max(self.peak_held, len(self.saved))
        self.peak_bytes = max(self.peak_bytes, sum(self.saved.values()))
        return y

    def backward(self, i, run):
        """run() (micro-batch i's backward), timed; i's activations no longer held."""
        start = time.perf_counter()
        run()
        self._note("backward", i, start)
        self.saved.pop(i)

    def _note(self, kind, i, start):
        self.trace.append({"stage": self.stage_index, "kind": kind, "mb": i,
                           "start": start - self.t0, "end": time.perf_counter() - self.t0})


def draw_trace(results, path):
    """Each stage's forwards and backwards of one step, GPipe above 1F1B: results[r] holds
    rank r's traces under "ScheduleGPipe" and "Schedule1F1B"."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, 1, figsize=(9, 1.2 + 0.6 * len(results)), sharex=True)
    for ax, schedule in zip(axes, ("ScheduleGPipe", "Schedule1F1B")):
        for r in results:
            for e in r[schedule]:
                colour = "tab:blue" if e["kind"] == "forward" else "tab:orange"
                ax.broken_barh([(e["start"] * 1e3, (e["end"] - e["start"]) * 1e3)],
                               (e["stage"] - 0.4, 0.8), color=colour)
                ax.text((e["start"] + e["end"]) * 500, e["stage"], str(e["mb"]), ha="center",
                        va="center", fontsize=7)
        ax.set_ylabel("stage")
        ax.invert_yaxis()
        ax.set_title(f"{schedule[8:]}, m = 8: forward (blue), backward (orange)", fontsize=9)
    axes[-1].set_xlabel("ms from the step's start")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
