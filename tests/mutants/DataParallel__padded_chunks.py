"""Gives every device an entry, an empty slice of the batch where torch's chunk made fewer
chunks than devices (5 rows over 4 devices: 2 + 2 + 1 + 0): but torch's scatter gives one
entry per chunk, and DataParallel then runs as many replicas as there are chunks, none on an
empty batch (which a module with a batch-norm, or a mean over the batch, cannot take)."""
CAUGHT_BY = "scatter: 10, 5 and 3 rows over 4 devices, nested containers, as torch"
HINT = "one entry per chunk: torch's chunk can give fewer"
PATCH = [("        return [c.to(d) for c, d in zip(obj.chunk(len(devices), dim), devices)]",
          """        chunks = list(obj.chunk(len(devices), dim))
        chunks += [obj.narrow(dim, 0, 0)] * (len(devices) - len(chunks))  # one per device
        return [c.to(d) for c, d in zip(chunks, devices)]""")]
