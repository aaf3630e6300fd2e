"""Creates the first residual with torch.zeros(buffer.shape): float32, the default dtype,
whatever the bucket's dtype, and keeps every later residual in it (copy_), so a float64
model's residual is rounded to 7 digits each step and the compressed gradients drift from
torch's. The residual takes the buffer's dtype (torch.zeros_like(buffer)).

Written as changes to the reference (dist_sgd/course/skeleton.reference): each (old, new)
replaces text that occurs once in it, so the wrong version follows the reference as it changes."""

CAUGHT_BY = "rank 1 with error feedback and warm start: torch's gradients, 5 steps"
HINT = "a later compressed step: the residual of the"
PATCH = [
    ("    if index in state.error_dict:\n"
     "        buffer.add_(state.error_dict[index])  # what we failed to send last step\n",
     "    if index not in state.error_dict:\n"
     "        state.error_dict[index] = torch.zeros(buffer.shape)\n"),
    ("        state.error_dict[index] = torch.zeros_like(buffer)\n"
     "    # A buffer kept per bucket: a fresh 4.6 MiB each step costs page faults, a "
     "copy less.\n"
     "    return state.before_dict.setdefault(index, torch.empty_like(buffer)).copy_(buffer)\n",
     "        buffer.add_(state.error_dict[index])\n"
     "    return buffer.clone()\n"),
    ("    # For the plain vectors that is (local - average), which sums to zero over "
     "ranks and so\n"
     "    # cancels next step: torch keeps it too, and so do we, to stay equal to "
     "torch step for step.\n"
     "    torch.sub(before, buffer, out=state.error_dict[index])\n",
     "    state.error_dict[index].copy_(before - buffer)\n"),
]
