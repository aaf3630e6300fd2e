"""Hands anything that is not a tensor (a flag, a float option, a tag) to the first replica
only and None to the others, as a value that cannot be split: but every replica runs the
module's whole forward and needs the same options as one process. torch's scatter gives each
replica the object itself."""
CAUGHT_BY = "scatter: 10, 5 and 3 rows over 4 devices, nested containers, as torch"
HINT = "anything but a tensor or a container goes to every replica as it is"
PATCH = [("    return [obj for _ in devices]",
          "    return [obj] + [None] * (len(devices) - 1)")]
