"""Adds state.error_dict[index] on every compressed step, the first one too: but nothing was
kept before the first compressed step, so the bucket has no entry yet (a KeyError). The first
time, the residual is zeros (created then, torch.zeros_like(buffer)).

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""

CAUGHT_BY = "rank 1 with error feedback and warm start: torch's gradients, 5 steps"
HINT = "state.error_dict has no entry for a bucket the first time"
PATCH = [
    ("    if index in state.error_dict:\n"
     "        buffer.add_(state.error_dict[index])  # what we failed to send last step\n"
     "    else:\n"
     "        state.error_dict[index] = torch.zeros_like(buffer)\n",
     "    buffer.add_(state.error_dict[index])  # what we failed to send last step\n"),
]
