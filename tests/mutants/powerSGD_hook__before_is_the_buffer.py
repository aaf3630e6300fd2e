"""add_error_feedback returns the bucket's buffer itself as `before`, not a copy: the buffer is
then overwritten with P Q^T, so at the end before - buffer is zero, no residual is ever
kept, and error feedback does nothing. `before` must hold the gradient as it was before
compression: a copy.

Written as changes to the reference (dist_sgd/course/skeleton.reference): each (old, new)
replaces text that occurs once in it, so the wrong version follows the reference as it changes."""

CAUGHT_BY = "rank 1 with error feedback and warm start: torch's gradients, 5 steps"
HINT = "a later compressed step: the residual of the"
PATCH = [
    ("    if index in state.error_dict:\n"
     "        buffer.add_(state.error_dict[index])  # what we failed to send last step\n",
     "    if index not in state.error_dict:\n"
     "        state.error_dict[index] = torch.zeros_like(buffer)\n"),
    ("        state.error_dict[index] = torch.zeros_like(buffer)\n"
     "    # A buffer kept per bucket: a fresh 4.6 MiB each step costs page faults, a "
     "copy less.\n"
     "    return state.before_dict.setdefault(index, torch.empty_like(buffer)).copy_(buffer)\n",
     "        buffer.add_(state.error_dict[index])\n"
     "    return buffer\n"),
]
